"""Replicas refuse misconfiguration (issue 32 M6), two ``ethan serve`` processes on the suite's
PostgreSQL cluster:

- a second process with the ETHAN_REPLICA_ID of a live replica refuses to start, in one line
  (liveness is the id's lease in the database, renewed by the live one's heartbeat); a process
  reusing the id of a replica that was SIGKILLed starts once that lease has run out;
- a replica whose clock is 40 s ahead (libfaketime) leaves another replica's live leases alone:
  one model call per message (the leases are read and written in the database's time).

ETHAN_LEASE_SECONDS below 3 is refused by the settings (tests/bot/test_config.py).
"""

from __future__ import annotations

import asyncio
import time
from datetime import datetime
from zoneinfo import ZoneInfo

import aiohttp
import pytest

from memory.schedules.store import ScheduleStore
from storage import database
from tests.preflight import find_faketime
from tests.reliability.support import wait_until
from tests.replicas.fleet import LEASE_SECONDS, LarkSender, answered, assert_answered_once, mid, text_event

FAKETIME = find_faketime()        # optional: `make test` notes its absence (tests/preflight.py)
# The README's promise: without libfaketime these two are skipped, not failed (.ci/run installs it).
needs_faketime = pytest.mark.skipif(FAKETIME is None, reason="libfaketime missing: apt-get install faketime")


async def _exits(srv, timeout: float) -> int:
    await wait_until(lambda: srv.proc.poll() is not None, timeout, "the second replica exits")
    return srv.proc.returncode


async def test_a_second_process_with_a_live_replicas_id_refuses_to_start(fleet, lark, model):
    first, = await fleet.start(1)
    twin = fleet.add(ethan_replica_id="replica-0")
    twin.start()
    code = await _exits(twin, 8 * LEASE_SECONDS + 30)
    assert code != 0, twin.tail()
    problems = [line for line in twin.lines() if line.startswith("ethan:")]
    assert len(problems) == 1 and "ETHAN_REPLICA_ID" in problems[0] and "replica-0" in problems[0], twin.tail()
    assert [e for e in twin.entries() if e.get("event") == "replica.id_in_use"], twin.tail()
    # The live one goes on answering, alone.
    async with aiohttp.ClientSession() as http:
        ev = text_event(0, 0)
        await LarkSender(http).deliver([first.url], ev)
    await wait_until(lambda: answered(lark, {mid(ev)}) == 1, 30, "answered by the live replica")
    assert_answered_once(lark, {mid(ev)})
    # A replica SIGKILLed: its id is free again once its lease ran out (no live heartbeat).
    first.kill()
    again = fleet.add(ethan_replica_id="replica-0")
    await again.start_ready(8 * LEASE_SECONDS + 30)
    code, _ = await again.terminate()
    assert code == 0, again.tail()


@needs_faketime
async def test_a_replica_whose_clock_is_40_s_ahead_leaves_live_leases_alone(fleet, lark, model):
    model.latency = 2 * LEASE_SECONDS     # the answer outlives a lease: only the heartbeat keeps it
    honest = fleet.add()
    ahead = fleet.add(ld_preload=str(FAKETIME), faketime="+40s")
    for srv in (honest, ahead):
        srv.start()
    await asyncio.gather(honest.wait_ready(60), ahead.wait_ready(60))
    async with aiohttp.ClientSession() as http:
        events = [text_event(c, 0) for c in range(3)]
        side = LarkSender(http)
        for ev in events:
            await side.deliver([honest.url], ev)      # the honest replica holds every lease
    expected = {mid(ev) for ev in events}
    await wait_until(lambda: answered(lark, expected) == len(expected), 10 * LEASE_SECONDS + 30,
                     "every message answered")
    await asyncio.sleep(LEASE_SECONDS)
    calls = [r for r in model.chat_requests()]
    assert len(calls) == len(events), (
        f"{len(calls)} model calls for {len(events)} messages: the replica 40 s ahead took over live leases\n"
        f"{fleet.tails()}")
    assert_answered_once(lark, expected)
    took = [e for e in ahead.entries() if e.get("event") == "replica.took_over"]
    assert not took, took
    for srv in (honest, ahead):
        code, _ = await srv.terminate()
        assert code == 0, srv.tail()


@needs_faketime
async def test_a_replica_whose_clock_is_40_s_ahead_sends_a_reminder_at_its_time_once(fleet, lark, model):
    """Reminder due times and claims are read in the database's time too: the replica 40 s
    ahead neither sends it 40 s early nor takes over the other's claim."""
    db = await database(fleet.database_url).open()       # migrates, as a replica would
    try:
        # Due after both replicas are up; to the fast clock it is due the moment it starts.
        due = time.time() + 35
        local = datetime.fromtimestamp(due, ZoneInfo("UTC")).replace(tzinfo=None).isoformat()
        await ScheduleStore(db).add(owner_id="ou_clock", chat_id="oc_clock", chat_type="p2p",
                                    text="clock-reminder", tz="UTC", dtstart=local)
    finally:
        await db.close()
    honest = fleet.add()
    ahead = fleet.add(ld_preload=str(FAKETIME), faketime="+40s")
    for srv in (honest, ahead):
        srv.start()
    await asyncio.gather(honest.wait_ready(60), ahead.wait_ready(60))
    sent = lambda: [m for m in lark.messages() if m.kind == "create" and m.text.startswith("clock-reminder")]  # noqa: E731
    await wait_until(lambda: sent(), 90, "the reminder")
    await asyncio.sleep(LEASE_SECONDS + 3)      # a second send would have come by now
    got = sent()
    assert len(got) == 1, [m.text for m in got]
    assert got[0].at >= int(due) - 1, f"sent {due - got[0].at:.1f} s before its due time\n{fleet.tails()}"
    for srv in (honest, ahead):
        code, _ = await srv.terminate()
        assert code == 0, srv.tail()
