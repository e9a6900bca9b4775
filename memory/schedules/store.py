"""The schedule store: reminders and scheduled messages (one-shot or RFC 5545 recurring).

A job belongs to its owner (the user who set it) and the chat it was set in; every read that
serves a user filters by owner (or, for a chat's admin, by chat) in SQL. ``next_due`` is the
UTC epoch of the job's next occurrence (memory/schedules/recurrence.py computes it in the job's zone).

Exactly once per occurrence, across restarts and replicas (docs/reliability.md "Reminders"):
a replica claims due jobs with a lease (``claim_owner``, ``lease_until``) as inbox rows are
claimed — ``FOR UPDATE SKIP LOCKED`` on PostgreSQL, so concurrent claimers take different
rows; on SQLite the write transaction holds the file's write lock — and only the claim's holder
may record the occurrence (``finish``: conditional on the claim and on ``next_due`` still
being that occurrence). A holder that dies between its send and ``finish`` leaves the claim to
expire; the next claimer sends again with the same Lark uuid (the job id and the occurrence),
which Lark deduplicates. ``schedule_deliveries``' primary key (job, occurrence) keeps one
record per occurrence whatever happens.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any, Callable

from memory.leases import default_replica_id
from storage import dialect_of, serialize
from memory.schedules.recurrence import RecurrenceError, next_after, next_skipping

LEASE_SECONDS = 120.0        # longer than a model-written delivery's deadline
STATES = ("active", "done", "cancelled", "stopped")


class TooManySchedules(ValueError):
    def __init__(self, limit: int, scope: str = "user") -> None:
        super().__init__(f"at most {limit} active reminders per {scope}")
        self.limit = limit
        self.scope = scope          # "user" | "chat"


@dataclass(frozen=True, slots=True)
class Schedule:
    id: int
    owner_id: str
    session_id: str
    chat_id: str
    chat_type: str
    text: str
    use_model: bool
    tz: str
    dtstart: str
    rrule: str
    next_due: float | None
    state: str
    claim_owner: str | None
    lease_until: float
    created_at: float
    updated_at: float
    note: str


@dataclass(frozen=True, slots=True)
class Delivery:
    schedule_id: int
    due_at: float
    status: str          # sent | late | skipped | failed
    at: float
    lark_message_id: str
    detail: str


def _job(r: Any) -> Schedule:
    return Schedule(int(r["id"]), r["owner_id"], r["session_id"], r["chat_id"], r["chat_type"], r["text"],
                    bool(r["use_model"]), r["tz"], r["dtstart"], r["rrule"],
                    None if r["next_due"] is None else float(r["next_due"]), r["state"], r["claim_owner"],
                    float(r["lease_until"]), float(r["created_at"]), float(r["updated_at"]), r["note"])


def _delivery(r: Any) -> Delivery:
    return Delivery(int(r["schedule_id"]), float(r["due_at"]), r["status"], float(r["at"]),
                    r["lark_message_id"], r["detail"])


class ScheduleStore:
    def __init__(self, db: Any, *, clock: Callable[[], float] = time.time, owner: str | None = None,
                 lease_seconds: float = LEASE_SECONDS) -> None:
        self.db = db
        self.clock = clock
        self.owner = owner or default_replica_id()
        self.lease_seconds = float(lease_seconds)

    # -- writing jobs ---------------------------------------------------------------
    async def add(self, *, owner_id: str, chat_id: str, chat_type: str, text: str, tz: str, dtstart: str,
                  rrule: str = "", use_model: bool = False, session_id: str = "",
                  max_active: int | None = None, max_in_chat: int | None = None,
                  first: float | None = None) -> Schedule:
        """Store a job; its first occurrence is at or after ``dtstart`` (the caller checked it
        is in the future; ``first``: the occurrence it found, else it is looked for here, off
        the loop). ``max_active`` / ``max_in_chat``: refused (TooManySchedules) when the owner /
        the chat already has that many active jobs — counted in the same write transaction, so
        two concurrent adds cannot both pass."""
        if first is None:
            first = await asyncio.to_thread(next_after, dtstart, tz, rrule, self.clock(), inclusive=True)
        if first is None:
            raise ValueError("the schedule has no occurrence in the future")
        job_id = await self.db.write(_add, dict(
            owner_id=owner_id, session_id=session_id, chat_id=chat_id, chat_type=chat_type, text=text,
            use_model=int(bool(use_model)), tz=tz, dtstart=dtstart, rrule=rrule, next_due=first,
            now=self.clock()), max_active, max_in_chat)
        if isinstance(job_id, TooManySchedules):
            raise job_id
        job = await self.get(job_id)
        assert job is not None
        return job

    async def cancel(self, job_id: int, *, owner_id: str | None = None, chat_id: str | None = None) -> bool:
        """Cancel an active job of this owner (or, for a chat's admin, of this chat); False when
        there is no such job. One of the two scopes is required: never an unscoped cancel."""
        if owner_id is None and chat_id is None:
            raise ValueError("cancel needs an owner or a chat scope")
        col, val = ("owner_id", owner_id) if owner_id is not None else ("chat_id", chat_id)
        return await self.db.execute(
            f"UPDATE schedules SET state = 'cancelled', updated_at = ?, claim_owner = NULL, lease_until = 0"
            f" WHERE id = ? AND {col} = ? AND state = 'active'", (self.clock(), int(job_id), val)) > 0

    async def cancel_any(self, job_id: int) -> bool:
        """The console's cancel (behind its token): any active job."""
        return await self.db.execute(
            "UPDATE schedules SET state = 'cancelled', updated_at = ?, claim_owner = NULL, lease_until = 0"
            " WHERE id = ? AND state = 'active'", (self.clock(), int(job_id))) > 0

    async def stop(self, job_id: int, reason: str) -> bool:
        """Stop a job that cannot be delivered any more (bot removed from the chat, user gone)."""
        return await self.db.execute(
            "UPDATE schedules SET state = 'stopped', note = ?, updated_at = ?, claim_owner = NULL, lease_until = 0"
            " WHERE id = ? AND state = 'active'", (reason[:500], self.clock(), int(job_id))) > 0

    async def stop_chat(self, chat_id: str, reason: str) -> int:
        return await self.db.execute(
            "UPDATE schedules SET state = 'stopped', note = ?, updated_at = ?, claim_owner = NULL, lease_until = 0"
            " WHERE chat_id = ? AND state = 'active'", (reason[:500], self.clock(), chat_id))

    # -- reading --------------------------------------------------------------------
    async def get(self, job_id: int) -> Schedule | None:
        r = await self.db.fetchone("SELECT * FROM schedules WHERE id = ?", (int(job_id),))
        return None if r is None else _job(r)

    async def for_owner(self, owner_id: str, *, active_only: bool = True, limit: int = 100) -> list[Schedule]:
        where = " AND state = 'active'" if active_only else ""
        rows = await self.db.fetchall(
            f"SELECT * FROM schedules WHERE owner_id = ?{where} ORDER BY next_due IS NULL, next_due, id LIMIT ?",
            (owner_id, limit))
        return [_job(r) for r in rows]

    async def for_chat(self, chat_id: str, *, active_only: bool = True, limit: int = 100) -> list[Schedule]:
        where = " AND state = 'active'" if active_only else ""
        rows = await self.db.fetchall(
            f"SELECT * FROM schedules WHERE chat_id = ?{where} ORDER BY next_due IS NULL, next_due, id LIMIT ?",
            (chat_id, limit))
        return [_job(r) for r in rows]

    async def all(self, *, state: str | None = "active", limit: int = 200, offset: int = 0) -> list[Schedule]:
        where, params = ("WHERE state = ?", (state,)) if state else ("", ())
        rows = await self.db.fetchall(
            f"SELECT * FROM schedules {where} ORDER BY next_due IS NULL, next_due, id LIMIT ? OFFSET ?",
            (*params, limit, offset))
        return [_job(r) for r in rows]

    async def count_active(self, owner_id: str) -> int:
        r = await self.db.fetchone("SELECT COUNT(*) FROM schedules WHERE owner_id = ? AND state = 'active'",
                                   (owner_id,))
        return int(r[0])

    async def deliveries(self, job_id: int, *, limit: int = 50) -> list[Delivery]:
        rows = await self.db.fetchall(
            "SELECT * FROM schedule_deliveries WHERE schedule_id = ? ORDER BY due_at DESC LIMIT ?",
            (int(job_id), limit))
        return [_delivery(r) for r in rows]

    async def missed(self, owner_id: str, *, since: float, limit: int = 20) -> list[tuple[Schedule, Delivery]]:
        """The owner's occurrences skipped (past the grace window) since ``since``, newest first."""
        rows = await self.db.fetchall(
            "SELECT s.*, d.due_at AS d_due, d.status AS d_status, d.at AS d_at,"
            " d.lark_message_id AS d_mid, d.detail AS d_detail"
            " FROM schedule_deliveries d JOIN schedules s ON s.id = d.schedule_id"
            " WHERE s.owner_id = ? AND d.status = 'skipped' AND d.at >= ? ORDER BY d.due_at DESC LIMIT ?",
            (owner_id, since, limit))
        return [(_job(r), Delivery(int(r["id"]), float(r["d_due"]), r["d_status"], float(r["d_at"]),
                                   r["d_mid"], r["d_detail"])) for r in rows]

    async def next_due_time(self) -> float | None:
        """The earliest next_due of an active job nobody holds (what the scheduler sleeps until)."""
        r = await self.db.fetchone(
            "SELECT MIN(next_due) FROM schedules WHERE state = 'active' AND next_due IS NOT NULL")
        return None if r is None or r[0] is None else float(r[0])

    async def next_wake(self, now: float) -> float | None:
        """When a claim could next be made: the earliest due time of a free job, or the end of
        a live lease on a due one (its holder may die) — so a sleeper never spins on a job
        another replica holds."""
        r = await self.db.fetchone(
            "SELECT MIN(CASE WHEN claim_owner IS NOT NULL AND lease_until >= ? AND next_due <= lease_until"
            " THEN lease_until ELSE next_due END) FROM schedules WHERE state = 'active' AND next_due IS NOT NULL",
            (now,))
        return None if r is None or r[0] is None else float(r[0])

    # -- claiming and recording occurrences -----------------------------------------
    async def claim_due(self, *, limit: int = 50) -> list[Schedule]:
        """Claim active jobs due now that nobody holds (unclaimed or lease expired), earliest
        first; they are this replica's until ``finish`` or the lease ends."""
        now = self.clock()
        rows = await self.db.write(_claim, self.owner, now, now + self.lease_seconds, limit)
        return [_job(r) for r in rows]

    async def finish(self, job: Schedule, due_at: float, status: str, *, lark_message_id: str = "",
                     detail: str = "", skip_until: float | None = None) -> bool:
        """Record the occurrence ``due_at`` of a claimed job and advance it to its next one
        (``done`` when none is left); the claim is released. ``skip_until``: occurrences before
        it are skipped too (counted in the detail) — a long outage leaves one record, not one
        per missed hour. False when this replica no longer held the claim on that occurrence
        (its lease expired and another replica took it over): nothing is recorded."""
        try:
            # Off the loop and bounded (memory/schedules/recurrence.py): one walk, however many are skipped.
            nxt, skipped = (await asyncio.to_thread(next_skipping, job.dtstart, job.tz, job.rrule, due_at,
                                                    skip_until) if job.rrule else (None, 0))
        except RecurrenceError as e:    # a rule stored before it was vetted: it ends here, said why
            nxt, skipped = None, 0
            detail = (detail + f"; no next occurrence found ({str(e)[:200]})").lstrip("; ")
        if skipped:
            detail = (detail + f"; {skipped} later occurrence(s) skipped too").lstrip("; ")
        return await self.db.write(_finish, job.id, self.owner, due_at, status, nxt, self.clock(),
                                   lark_message_id, detail[:500])

    async def give_up(self, job: Schedule, due_at: float, reason: str) -> bool:
        """The chat cannot be sent to any more: the occurrence is recorded ``failed`` and the
        job ``stopped`` (whatever its rule), in one transaction, by the claim's holder only."""
        return await self.db.write(_give_up, job.id, self.owner, due_at, self.clock(), reason[:500])

    async def release(self, job_id: int) -> None:
        """Give a claim back (a send that failed transiently: the next poll retries it)."""
        await self.db.execute(
            "UPDATE schedules SET claim_owner = NULL, lease_until = 0 WHERE id = ? AND claim_owner = ?",
            (int(job_id), self.owner))

    async def release_all(self) -> None:
        await self.db.execute(
            "UPDATE schedules SET claim_owner = NULL, lease_until = 0 WHERE claim_owner = ?", (self.owner,))


def _add(conn: Any, row: dict, max_active: int | None, max_in_chat: int | None = None) -> int | TooManySchedules:
    # The counts and the insert: one add per chat and per user at a time. Two locks, always
    # chat then user (the only unit that takes a "chat" lock), so two adds cannot deadlock.
    if max_in_chat is not None:
        serialize(conn, "chat", row["chat_id"])
        n = conn.execute("SELECT COUNT(*) FROM schedules WHERE chat_id = ? AND state = 'active'",
                         (row["chat_id"],)).fetchone()[0]
        if n >= max_in_chat:
            return TooManySchedules(max_in_chat, "chat")
    if max_active is not None:
        serialize(conn, "user", row["owner_id"])
        n = conn.execute("SELECT COUNT(*) FROM schedules WHERE owner_id = ? AND state = 'active'",
                         (row["owner_id"],)).fetchone()[0]
        if n >= max_active:
            return TooManySchedules(max_active, "user")
    cur = conn.execute(
        "INSERT INTO schedules(owner_id, session_id, chat_id, chat_type, text, use_model, tz, dtstart, rrule,"
        " next_due, state, created_at, updated_at) VALUES (?,?,?,?,?,?,?,?,?,?,'active',?,?)",
        (row["owner_id"], row["session_id"], row["chat_id"], row["chat_type"], row["text"], row["use_model"],
         row["tz"], row["dtstart"], row["rrule"], row["next_due"], row["now"], row["now"]))
    return int(cur.lastrowid)


def _claim(conn: Any, owner: str, now: float, until: float, limit: int) -> list:
    lock = " FOR UPDATE SKIP LOCKED" if dialect_of(conn) == "postgres" else ""
    ids = [r[0] for r in conn.execute(
        "SELECT id FROM schedules WHERE state = 'active' AND next_due IS NOT NULL AND next_due <= ?"
        " AND (claim_owner IS NULL OR lease_until < ?) ORDER BY next_due, id LIMIT ?" + lock,
        (now, now, limit)).fetchall()]
    if not ids:
        return []
    marks = ",".join("?" * len(ids))
    conn.execute(f"UPDATE schedules SET claim_owner = ?, lease_until = ? WHERE id IN ({marks})",
                 (owner, until, *ids))
    return conn.execute(f"SELECT * FROM schedules WHERE id IN ({marks}) ORDER BY next_due, id", ids).fetchall()


def _give_up(conn: Any, job_id: int, owner: str, due_at: float, now: float, reason: str) -> bool:
    held = conn.execute(
        "UPDATE schedules SET state = 'stopped', note = ?, claim_owner = NULL, lease_until = 0, updated_at = ?"
        " WHERE id = ? AND claim_owner = ? AND next_due = ? AND state = 'active'",
        (reason, now, job_id, owner, due_at)).rowcount > 0
    if held:
        conn.execute("INSERT INTO schedule_deliveries(schedule_id, due_at, status, at, lark_message_id, detail)"
                     " VALUES (?,?,'failed',?,'',?) ON CONFLICT DO NOTHING", (job_id, due_at, now, reason))
    return held


def _finish(conn: Any, job_id: int, owner: str, due_at: float, status: str, nxt: float | None, now: float,
            mid: str, detail: str) -> bool:
    held = conn.execute(
        # The flag as a typed parameter, not `? IS NULL`: a prepared statement cannot type a NULL.
        "UPDATE schedules SET next_due = ?, state = CASE WHEN ? = 1 THEN 'done' ELSE state END,"
        " claim_owner = NULL, lease_until = 0, updated_at = ?"
        " WHERE id = ? AND claim_owner = ? AND next_due = ? AND state = 'active'",
        (nxt, int(nxt is None), now, job_id, owner, due_at)).rowcount > 0
    if not held:
        # Cancelled while it was being sent: the message went out, so it is recorded anyway.
        held = conn.execute("UPDATE schedules SET claim_owner = NULL, lease_until = 0, updated_at = ?"
                            " WHERE id = ? AND claim_owner = ? AND next_due = ? AND state = 'cancelled'",
                            (now, job_id, owner, due_at)).rowcount > 0
    if held:
        conn.execute("INSERT INTO schedule_deliveries(schedule_id, due_at, status, at, lark_message_id, detail)"
                     " VALUES (?,?,?,?,?,?) ON CONFLICT DO NOTHING", (job_id, due_at, status, now, mid, detail))
    return held
