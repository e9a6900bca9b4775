"""Start-up steps of delivery in the background: ``delivery`` (the inbox, retries and
redelivery, the replicas' leases — stopping it stops the reminder scheduler, the retry timers
and every background loop, then hands this replica's rows to the others), ``inbox recovery``
(answer what was acknowledged but not answered before the last stop), ``housekeeping``,
``scheduler`` (reminders) and ``replica poll``. Apart from the message path because these run
beside it, on timers, and are what shutdown cancels.
"""

from __future__ import annotations

import asyncio
from typing import Any

from bot.delivery.inbox_store import Inbox
from bot.delivery.redelivery import Redelivery
from bot.delivery.replicas import Replicas
from bot.infra.log import get_logger
from bot.lark.lifecycle import decoded as lark_decoded
from bot.startup.lifespan import Boot, Shutdown

log = get_logger("ethan.app")


async def start_delivery(app: Any, boot: Boot) -> None:
    s, shared, lease_clock = app.settings, boot.shared, boot.lease_clock
    app.inbox = Inbox(app.db, owner=s.replica_id, lease_seconds=s.ethan_lease_seconds,
                      conversations=shared, clock=lease_clock)
    app.redelivery = redelivery = Redelivery(app.inbox, closing=lambda: app.closing, spawn=app._spawn)
    redelivery.in_thread = _in_thread
    if shared:
        app.replicas = redelivery.replicas = Replicas(app.inbox, lambda: app.dispatcher,
                                                      waiting=lambda: redelivery.waiting,
                                                      clock=lease_clock)
        if app.recover_inbox:      # `ethan chat` beside a server takes no Lark work
            await app.replicas.claim_id()      # or ReplicaIdInUse: another live process has the id
        # Renewing from now on: the id's lease (and every row this replica stores) must
        # outlive a slow start-up (the model check, MCP servers).
        app._spawn(app.replicas.heartbeat(), "replica-heartbeat")


async def stop_delivery(app: Any, shutdown: Shutdown) -> None:
    if app.scheduler is not None:        # before the database and the Lark client close
        await app.scheduler.stop()
    if app.redelivery is not None:       # retry timers: their items stay pending in the inbox
        app.redelivery.stop()
    for task in list(app._background):
        task.cancel()
    await asyncio.gather(*app._background, return_exceptions=True)
    if app.replicas is not None and app.replicas.id_held:
        # What this replica did not answer goes to the others now, not after the lease
        # (an upgrade one replica at a time leaves no gap).
        try:
            await app.inbox.release_all()
        except Exception as e:  # noqa: BLE001 - the leases expire by themselves
            log.warning("replica.release_failed", replica=app.inbox.owner, error=str(e)[:200])


async def recover_inbox(app: Any, boot: Boot) -> None:
    if app.recover_inbox:
        await app.redelivery.recover()


async def start_housekeeping(app: Any, boot: Boot) -> None:
    app._spawn(app.redelivery.housekeeping(close_idle=app._close_idle, outbox=app.outbox), "housekeeping")


async def start_scheduler(app: Any, boot: Boot) -> None:
    s = app.settings
    if app.sender is not None and app.recover_inbox:    # `ethan chat` beside a server sends none
        from bot.schedules.scheduler import LarkDelivery, Scheduler

        app.scheduler = Scheduler(app.schedules, LarkDelivery(app.sender, app.db),
                                  compose=app._compose_reminder, clock=app.schedules.clock,
                                  grace_s=s.ethan_reminder_grace_hours * 3600)
        app.scheduler.start()


async def start_replica_poll(app: Any, boot: Boot) -> None:
    if app.replicas is not None and app.recover_inbox:   # `ethan chat` beside a server leaves its events alone
        app._spawn(app.replicas.poll(), "replica-poll")


def _in_thread(item) -> bool:
    """Whether a stored Lark item's message is in a thread: the intake's decoded event (no
    second parse). ``ValueError`` / ``RecursionError`` for a payload that does not parse."""
    ev = lark_decoded(item)
    return ev is not None and ev.in_thread
