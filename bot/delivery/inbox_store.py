"""The inbox: every accepted Lark event is committed here before it is acknowledged.

It is also the dedup store that survives restarts: ``event_id`` and ``dedup_key`` (the
event's kind and the message it is about: ``msg:om_…``, ``recall:om_…``) are both unique,
so a redelivery (same event) or a re-send under a new event id (same message) is recognised
for as long as rows are kept (24 h > Lark's 8 h rule), while a later, different event about
the same message (its recall) is not mistaken for a duplicate.

Replicas (DESIGN.md §7, docs/reliability.md "Replicas"): each row has an ``owner`` (the
replica that accepted or claimed it) and a ``lease_until`` its owner's heartbeat renews; a
replica claims a row (``start``) only when it is pending and unowned, its own, or its lease
expired — one conditional UPDATE, atomic on both engines. With ``conversations`` on (a shared
database), one conversation is worked by one replica at a time: ``conversation_leases`` holds
the conversation's owner under the same rule, claimed in the very transaction that stores an
event, so the accepting replica either holds the conversation or leaves the row unowned for
the replica that does.
"""

from __future__ import annotations

import asyncio
import secrets
import sqlite3
import time
from dataclasses import dataclass, field
from typing import Any

from memory.leases import CONVERSATIONS, REPLICA_KEY, default_replica_id, free_sql
from storage import Database, IntegrityError, dialect_of, execute_last, for_update

KEEP_SECONDS = 24 * 3600
STALE_SECONDS = 30 * 60
LEASE_SECONDS = 15.0
ORPHAN_BATCH = 200        # pending rows one poll takes over at most (the next poll takes more)
INSERT_COLUMNS = ("event_id, message_id, chat_id, conv_key, create_time, received_at, payload, status, note,"
                  " event_type, dedup_key, owner, lease_until")
BATCH_ROWS = 500          # rows per INSERT statement on PostgreSQL (13 parameters each; it allows 65,535)


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
    # The accepting replica got the conversation's lease with the row (a shared database):
    # it works the row; False, another replica holds the conversation and picks the row up.
    held: bool = False
    # The transport's decoded event when this process decoded it already (the intake: Lark's
    # bot/lark/events.py LarkEvent), so it is not parsed again; never stored (the payload is).
    event: Any = field(default=None, compare=False, repr=False)


class Inbox:
    def __init__(self, db: Database, *, clock=time.time, owner: str | None = None,
                 lease_seconds: float = LEASE_SECONDS, conversations: bool = False) -> None:
        self.db = db
        self.clock = clock
        self.owner = owner or default_replica_id()
        # This process's hold on the replica id (``hold_identity``): two live processes with
        # one ETHAN_REPLICA_ID would each take the other's rows for their own (issue 32 M6).
        self.instance = f"{self.owner}#{secrets.token_hex(6)}"
        self.lease_seconds = float(lease_seconds)
        # Claim the conversation's lease with every stored event (replicas on one database).
        self.conversations = conversations
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
        stored = await future
        if stored is None:
            return None
        rowid, held = stored
        return InboxItem(rowid, event_id, message_id, chat_id, conv_key, create_time, row[5],
                         payload, status, 0, event_type, held)

    async def _flush(self) -> None:
        try:
            while self._batch:
                batch, self._batch = self._batch, []
                try:
                    try:
                        ids = await self._store([row for row, _ in batch])
                    except IntegrityError:
                        if len(batch) == 1:
                            raise
                        # PostgreSQL stores a batch in one statement: a row that breaks a
                        # constraint fails them all. Alone, it fails by itself.
                        ids = [await self._store_alone(row) for row, _ in batch]
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
                        future.set_result(rowid)    # (id, held) or None: a duplicate
        finally:
            self._flusher = None

    async def _store(self, rows: list[tuple]) -> list:
        now = self.clock()
        # Ahead of the replies' writes: Lark waits for this commit (the acknowledgement), a
        # reply does not (storage/queueing.py).
        return await self.db.write_first(_insert_rows, rows, self.owner, now, now + self.lease_seconds,
                                         self.conversations)

    async def _store_alone(self, row: tuple) -> Any:
        try:
            return (await self._store([row]))[0]
        except IntegrityError as e:
            return e

    async def start(self, item_id: int) -> bool:
        """Claim the row and count an attempt; False when it is no longer pending (a recall
        cancelled it while it waited in its mailbox, another replica answered it) or another
        live replica owns it."""
        now = self.clock()
        return await self.db.execute(
            "UPDATE inbox SET attempts = attempts + 1, owner = ?, lease_until = ?"
            f" WHERE id = ? AND status = 'pending' AND {free_sql()}",
            (self.owner, now + self.lease_seconds, item_id, self.owner, now)) > 0

    async def why_unclaimed(self, item_id: int) -> str:
        """Why ``start`` refused the row (the rare path, so one more read is fine): "recalled"
        (a recall cancelled it), "finished" (answered or dropped already, e.g. by another
        replica), "owned" (another live replica holds it), "gone" (pruned)."""
        row = await self.db.fetchone("SELECT status, note FROM inbox WHERE id = ?", (item_id,))
        if row is None:
            return "gone"
        if row["status"] == "pending":
            return "owned"
        return "recalled" if row["note"] == "recalled" else "finished"

    async def leave(self, item_id: int) -> None:
        """Give up this replica's row (another replica holds its conversation): unowned, the
        holder claims it."""
        await self.db.execute(
            "UPDATE inbox SET owner = NULL, lease_until = 0 WHERE id = ? AND owner = ? AND status = 'pending'",
            (item_id, self.owner))

    # -- conversation leases ------------------------------------------------------------
    async def hold(self, conv_key: str) -> bool:
        """Claim the conversation (free, already ours, or its lease expired): one statement."""
        now = self.clock()
        return await self.db.write(_claim_conversation, conv_key, self.owner, now, now + self.lease_seconds)

    async def release(self, conv_key: str) -> None:
        await self.db.write(CONVERSATIONS.release, conv_key, self.owner)

    async def hold_identity(self) -> tuple[bool, float]:
        """Claim this replica id for this process: (claimed, the id's lease end). Refused while
        another process holds it, i.e. until its lease runs out unrenewed."""
        now = self.clock()
        return await self.db.write(_claim_identity, REPLICA_KEY + self.owner, self.instance, now,
                                   now + self.lease_seconds)

    async def release_or_next(self, conv_key: str, *, max_age: float = STALE_SECONDS) -> list[InboxItem]:
        """The holder's worker for the conversation is done: the rows left for it, if any (the
        lease kept); else the lease released. One write transaction, so there is no release
        race: a replica storing an event for the conversation commits before it (the row is
        found here) or after it (it finds the conversation free and claims it itself)."""
        now = self.clock()
        rows = await self.db.write(_release_or_next, conv_key, self.owner, now, now - max_age)
        return [_item(r) for r in rows]

    async def renew(self) -> set[str]:
        """The heartbeat: extend this replica's leases on the rows it owns and the conversations
        it holds, in one transaction; returns the conversations it still holds (one it lost
        while the heartbeat could not reach the database is no longer its own)."""
        return await self.db.write(_renew, self.owner, self.instance, self.clock() + self.lease_seconds)

    async def release_all(self) -> None:
        """At a clean stop: every pending row and conversation of this replica goes back at
        once, so the others take it over without waiting for the lease."""
        await self.db.write(_release_all, self.owner, self.instance)

    async def claimable(self, conv_key: str, *, before: int | None = None,
                        max_age: float = STALE_SECONDS) -> list[InboxItem]:
        """The conversation's pending rows nobody works (unowned, or their owner's lease
        expired), oldest first: what its holder answers next, ``before`` a given row."""
        now = self.clock()
        sql = ("SELECT * FROM inbox WHERE conv_key = ? AND status = 'pending' AND create_time >= ?"
               f" AND {free_sql(own=False)}")
        params: list = [conv_key, now - max_age, now]
        if before is not None:
            sql += " AND id < ?"
            params.append(before)
        rows = await self.db.fetchall(sql + " ORDER BY id LIMIT ?", (*params, ORPHAN_BATCH))
        return [_item(r) for r in rows]

    async def orphans(self, *, own: bool = False, max_age: float = STALE_SECONDS,
                      limit: int = ORPHAN_BATCH) -> list[InboxItem]:
        """Pending rows nobody works whose conversation is free (no lease, ours, or expired),
        oldest first: a dead replica's acknowledged work, or a row left while its
        conversation's holder was releasing. ``own``: this replica's rows too (start-up
        recovery under a fixed ETHAN_REPLICA_ID)."""
        now = self.clock()
        mine = " OR i.owner = ?" if own else ""
        params = [now - max_age, now, *([self.owner] if own else []), self.owner, now, limit]
        rows = await self.db.fetchall(
            "SELECT i.* FROM inbox i LEFT JOIN conversation_leases c ON c.conv_key = i.conv_key"
            " WHERE i.status = 'pending' AND i.create_time >= ?"
            f" AND (i.owner IS NULL OR i.lease_until < ?{mine})"
            " AND (c.conv_key IS NULL OR c.owner = ? OR c.lease_until < ?)"
            " ORDER BY i.id LIMIT ?", params)
        return [_item(r) for r in rows]

    async def adopt_pending(self) -> int:
        """One process per SQLite file: whatever a previous process left pending is ours."""
        return await self.db.execute(
            "UPDATE inbox SET owner = ?, lease_until = ? WHERE status = 'pending'",
            (self.owner, self.clock() + self.lease_seconds))

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

def _insert_rows(conn, rows: list[tuple], owner: str, now: float, until: float,
                 conversations: bool) -> list[tuple[int, bool] | None | Exception]:
    """One unit of work: insert each row unless its event or message is known.

    ``ON CONFLICT DO NOTHING`` skips only uniqueness conflicts (the duplicates); ``INSERT OR
    IGNORE`` also swallowed NOT NULL and CHECK failures, so a NaN create_time (stored as NULL)
    made a new message look like a duplicate and vanish.

    With ``conversations``, a pending row's conversation lease is claimed in the same
    transaction: held, the row is this replica's; held elsewhere, the row is stored unowned
    and the holder answers it (in id order, after what it is working on)."""
    if dialect_of(conn) == "postgres":
        return _insert_rows_batched(conn, rows, owner, now, until, conversations)
    out: list[tuple[int, bool] | None | Exception] = []
    held: dict[str, bool] = {}
    if conversations:
        # Every lease of the batch first, in one fixed order: two replicas' batches about the
        # same conversations then lock their lease rows in the same order, never in a cycle
        # (PostgreSQL has no global write lock to order them; storage/postgres/database.py).
        for conv_key in sorted({row[3] for row in rows if row[7] == "pending"}):
            held[conv_key] = _claim_conversation(conn, conv_key, owner, now, until)
    for row in rows:
        conv_key, status = row[3], row[7]
        mine = True
        if conversations and status == "pending":
            mine = held[conv_key]
        try:
            cur = conn.execute(
                f"INSERT INTO inbox({INSERT_COLUMNS}) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?) ON CONFLICT DO NOTHING",
                (*row, owner if mine else None, until if mine else 0))
        except sqlite3.IntegrityError as e:
            # This row only (SQLite undoes the one statement): the rest of the group commits.
            out.append(e)
            continue
        out.append((cur.lastrowid, mine) if cur.rowcount else None)
    return out


def _insert_rows_batched(conn, rows: list[tuple], owner: str, now: float, until: float,
                         conversations: bool) -> list[tuple[int, bool] | None | Exception]:
    """``_insert_rows`` on PostgreSQL: the batch's leases in one statement and its rows with the
    COMMIT in one more (``execute_last``), so a group commit costs two round trips however many
    events it holds (one per row capped a replica at ~250 acknowledgements/s with the database
    2 ms away: issue 29).

    A row is new when its event id comes back from ``RETURNING``; ``ON CONFLICT DO NOTHING``
    keeps the first of a batch's rows about one event or message (rows are inserted in order,
    and a later row conflicts with an earlier one of the same statement), so the first row of
    an event id is the one that was stored and any later one is a duplicate. A row that breaks
    a constraint fails the whole statement here: the caller stores each row alone then."""
    held: set[str] = set()
    if conversations:
        held = CONVERSATIONS.claim_many(conn, [row[3] for row in rows if row[7] == "pending"], owner, now, until)
    mine = [not conversations or row[7] != "pending" or row[3] in held for row in rows]
    stored: dict[str, int] = {}
    for start in range(0, len(rows), BATCH_ROWS):
        chunk = rows[start:start + BATCH_ROWS]
        params: list = []
        for row, ours in zip(chunk, mine[start:start + BATCH_ROWS]):
            params.extend((*row, owner if ours else None, until if ours else 0))
        sql = (f"INSERT INTO inbox({INSERT_COLUMNS}) VALUES {', '.join(['(' + ','.join('?' * 13) + ')'] * len(chunk))}"
               " ON CONFLICT DO NOTHING RETURNING id, event_id")
        # the last chunk ends the unit: its COMMIT goes in the same round trip
        last = start + BATCH_ROWS >= len(rows)
        for r in (execute_last(conn, sql, params) if last else conn.execute(sql, params)).fetchall():
            stored[r[1]] = int(r[0])
    out: list[tuple[int, bool] | None | Exception] = []
    for row, ours in zip(rows, mine):
        rowid = stored.pop(row[0], None)      # popped: a second row of the same event is a duplicate
        out.append(None if rowid is None else (rowid, ours))
    return out


def _claim_conversation(conn, conv_key: str, owner: str, now: float, until: float) -> bool:
    """Free, ours, or expired -> ours until ``until``. One upsert: its WHERE makes a live
    holder's row untouched (0 rows changed) on both engines, atomically."""
    return CONVERSATIONS.claim(conn, conv_key, owner, now, until)


def _claim_identity(conn, key: str, instance: str, now: float, until: float) -> tuple[bool, float]:
    if CONVERSATIONS.claim(conn, key, instance, now, until):
        return True, until
    held = CONVERSATIONS.holder(conn, key)
    return False, held[1] if held else 0.0


_ORPHANS = ("FROM inbox WHERE conv_key = ? AND status = 'pending' AND create_time >= ?"
            " AND (owner IS NULL OR lease_until < ?)")


def _release_or_next(conn, conv_key: str, owner: str, now: float, cutoff: float) -> list:
    # The lease row first, locked: an accept storing a row for this conversation (its lease
    # upsert locks the same row) either committed before — and the statement below, a statement
    # of its own, sees its row — or waits, and after the DELETE claims the lease afresh. Without
    # it (no global write lock on PostgreSQL) the row could be left unowned with no holder.
    conn.execute("SELECT owner FROM conversation_leases WHERE conv_key = ? AND owner = ?" + for_update(conn),
                 (conv_key, owner))
    # Usually nothing is left: released in the same statement that looks (one round trip).
    if CONVERSATIONS.release_unless(conn, conv_key, owner, "SELECT 1 " + _ORPHANS, (conv_key, cutoff, now)):
        return []
    return conn.execute(f"SELECT * {_ORPHANS} ORDER BY id LIMIT ?", (conv_key, cutoff, now, ORPHAN_BATCH)).fetchall()


def _renew(conn, owner: str, instance: str, until: float) -> set[str]:
    conn.execute("UPDATE inbox SET lease_until = ? WHERE owner = ? AND status = 'pending'", (until, owner))
    CONVERSATIONS.renew(conn, owner, until)
    CONVERSATIONS.renew(conn, instance, until)      # the replica id's own lease (hold_identity)
    return CONVERSATIONS.held_by(conn, owner)


def _release_all(conn, owner: str, instance: str) -> None:
    conn.execute("UPDATE inbox SET owner = NULL, lease_until = 0 WHERE owner = ? AND status = 'pending'", (owner,))
    CONVERSATIONS.release_all(conn, owner)
    CONVERSATIONS.release_all(conn, instance)


def _item(row) -> InboxItem:
    return InboxItem(row["id"], row["event_id"], row["message_id"], row["chat_id"], row["conv_key"],
                     row["create_time"], row["received_at"], row["payload"], row["status"],
                     row["attempts"], row["event_type"])
