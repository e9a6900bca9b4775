"""N replicas on one database (DESIGN.md §7, docs/reliability.md "Replicas").

The leases themselves are the inbox store's (bot/delivery/inbox_store.py); this is the process's side:

- ``handle``: before a stored event is answered, this replica holds its conversation's lease
  (already held — no round trip — or claimed now). Held elsewhere, the row is left unowned for
  the holder. Rows of the conversation other replicas stored while this one held it (unowned)
  and older than the row at hand are answered first, so a conversation is answered in inbox
  id order whichever replica received its messages.
- ``on_idle``: before a conversation's worker exits, the rows left for it are answered; else
  the lease is released — both in one write transaction, so a replica storing an event for
  the conversation either commits first (its unowned row is found) or finds it free (no
  release race).
- ``claim_id``: at start, the replica id is this process's alone — a second live process with
  the same ETHAN_REPLICA_ID would take the first one's rows for its own (both "own" them) and
  answer a chat out of order, so it refuses to start (``ReplicaIdInUse``, one line). The id's
  lease is a row the heartbeat renews: a predecessor that died is waited out (at most a lease),
  one that renews meanwhile is alive;
- the heartbeat (every lease/3) re-reads the database's clock (every lease time is the
  database's, memory/leases.py ``DatabaseClock``), renews this replica's leases on its rows,
  conversations and id, and releases conversations it holds but no longer works;
- the poll (every ``POLL_S``) submits pending rows nobody works whose conversation is free:
  a dead replica's acknowledged work once its leases expired (no restart needed), and rows
  the release race left behind.

Exactly-once at the user does not rest on the leases alone (a replica paused past its lease
may still finish a reply another replica also sends): every reply's uuid is derived from the
message it answers and Lark drops a repeated uuid for an hour; a card reply's entity is found
in the outbox by that uuid and finished rather than sent twice.
"""

from __future__ import annotations

import asyncio
from typing import Awaitable, Callable

from bot.delivery.dispatcher import Dispatcher
from bot.delivery.inbox_store import Inbox, InboxItem
from bot.infra.log import get_logger
from memory.leases import DatabaseClock

log = get_logger("ethan.replicas")

POLL_S = 1.0


class ReplicaIdInUse(RuntimeError):
    """Another live process holds this ETHAN_REPLICA_ID on the database."""

    def __init__(self, replica: str) -> None:
        super().__init__(f"ETHAN_REPLICA_ID={replica} is in use by another live replica on this database "
                         "(its lease was renewed while this one waited); give every replica its own id, "
                         "or leave it unset (<hostname>:<pid>)")
        self.replica = replica


class Replicas:
    def __init__(self, inbox: Inbox, dispatcher: Callable[[], Dispatcher | None], *,
                 waiting: Callable[[], set[int]], poll_s: float = POLL_S,
                 clock: DatabaseClock | None = None) -> None:
        self.inbox = inbox
        self.clock = clock               # the database's clock: synced at every beat
        self.id_held = False             # claim_id succeeded: this process is the id's one replica
        self._dispatcher = dispatcher
        self._waiting = waiting          # rows with a retry timer: answered when it fires, not now
        self.poll_s = poll_s
        self.heartbeat_s = max(0.05, inbox.lease_seconds / 3)
        self.held: set[str] = set()      # conversations this replica holds the lease of
        self._queued: set[int] = set()   # rows submitted by this module and not yet handled
        self.taken_over = 0
        self._idle_once: set[str] = set()   # held, not worked at the last beat
        self._answered_early: set[int] = set()   # queued rows answered ahead of a newer one

    @property
    def owner(self) -> str:
        return self.inbox.owner

    async def claim_id(self) -> None:
        """This replica id for this process, or ``ReplicaIdInUse``: a holder whose lease end
        moves while we wait is alive; one that does not is waited out."""
        seen: float | None = None
        while True:
            ok, until = await self.inbox.hold_identity()
            if ok:
                self.id_held = True
                return
            if seen is not None and until > seen:
                log.error("replica.id_in_use", replica=self.owner,
                          fix="give every replica its own ETHAN_REPLICA_ID, or leave it unset")
                raise ReplicaIdInUse(self.owner)
            seen = until
            # Long enough for a live holder's next beat; no longer than its lease has left.
            await asyncio.sleep(min(self.heartbeat_s * 1.5, max(0.05, until - self.inbox.clock() + 0.05)))

    async def handle(self, item: InboxItem, run: Callable[[InboxItem], Awaitable[None]]) -> None:
        """Answer ``item`` (via ``run``) if this replica may work its conversation now."""
        conv = item.conv_key
        self._queued.discard(item.id)
        if item.id in self._answered_early:
            self._answered_early.discard(item.id)    # answered already, in id order (below)
            return
        if conv not in self.held and item.held and item.attempts == 0:
            self.held.add(conv)     # claimed with the row when it was stored, moments ago
        if conv not in self.held:
            if not await self.inbox.hold(conv):
                # Another live replica works this conversation: it answers the row, in order.
                await self.inbox.leave(item.id)
                log.info("replica.conversation_elsewhere", conv_key=conv, inbox_id=item.id,
                         event_id=item.event_id)
                return
            self.held.add(conv)
        for older in await self.inbox.claimable(conv, before=item.id):
            if older.id in self._waiting():
                continue
            # One still queued is in this conversation's mailbox behind the row at hand (our
            # own newer row was submitted while the idle look-up that found it ran): answered
            # now, in id order, and skipped when its turn comes (unless this attempt failed).
            if await self._run_quietly(older, run) and older.id in self._queued:
                self._answered_early.add(older.id)
        await run(item)

    async def _run_quietly(self, item: InboxItem, run) -> bool:
        try:
            await run(item)
            return True
        except asyncio.CancelledError:
            raise
        except Exception:  # noqa: BLE001 - the row stays pending; the one at hand goes on
            log.exception("dispatch.job_failed", conv_key=item.conv_key, inbox_id=item.id)
            return False

    async def on_idle(self, conv: str) -> list[InboxItem]:
        """The conversation's mailbox is empty: what other replicas left for it, else release."""
        if conv not in self.held:
            return []
        rows = await self.inbox.release_or_next(conv)
        if not rows:
            self.held.discard(conv)
            return []
        # Rows already on their way here (a retry timer, a queued take-over) are left out: the
        # lease stays until they run; the heartbeat releases it once nothing works it.
        return self._fresh(rows)

    def _fresh(self, items: list[InboxItem]) -> list[InboxItem]:
        waiting = self._waiting()
        out = [i for i in items if i.id not in waiting and i.id not in self._queued]
        self._queued.update(i.id for i in out)
        return out

    async def heartbeat(self) -> None:
        await self._every(self.heartbeat_s, self.beat, "replica.heartbeat_failed")

    async def poll(self) -> None:
        await self._every(self.poll_s, self.take_over, "replica.poll_failed")

    async def _every(self, seconds: float, step: Callable[[], Awaitable[object]], failed: str) -> None:
        while True:
            await asyncio.sleep(seconds)
            try:
                await step()
            except asyncio.CancelledError:
                raise
            except Exception as e:  # noqa: BLE001 - the next round tries again; leases may lapse
                log.warning(failed, replica=self.owner, error=f"{type(e).__name__}: {e}"[:200])

    async def beat(self) -> None:
        if self.clock is not None:
            await self.clock.sync(self.inbox.db)
        before = set(self.held)
        still = await self.inbox.renew()
        lost = before - still
        if lost:
            # Not renewed in time (the database was out of reach): another replica may work
            # these conversations now; claimed again before this one answers in them.
            self.held -= lost
            log.warning("replica.lease_lost", replica=self.owner, conversations=len(lost))
        d = self._dispatcher()
        idle = {conv for conv in still if d is None or not d.active(conv)}
        for conv in idle & self._idle_once:
            # Not worked here at two beats in a row (claimed with an event that turned out a
            # duplicate, kept for a row whose retry is waiting): nobody else should wait for it.
            # One beat is not enough: an event stored a moment ago is on its way to its worker.
            self.held.discard(conv)
            await self.inbox.release(conv)
        self._idle_once = idle - self._idle_once

    async def take_over(self, *, own: bool = False) -> int:
        """Submit pending rows nobody works whose conversation is free; returns how many."""
        d = self._dispatcher()
        if d is None or not d.accepting:
            return 0
        rows = await self.inbox.orphans(own=own)
        waiting = self._waiting()
        submitted, conversations = 0, set()
        for item in rows:
            if item.id in waiting or item.id in self._queued or d.active(item.conv_key) \
                    and item.conv_key not in conversations:
                continue
            self._queued.add(item.id)
            if d.submit(item.conv_key, item):
                submitted += 1
                conversations.add(item.conv_key)
            else:
                self._queued.discard(item.id)
        if submitted and not own:
            self.taken_over += submitted
            log.info("replica.took_over", replica=self.owner, rows=submitted,
                     conversations=len(conversations))
        return submitted
