"""Three replicas on one PostgreSQL database: each reminder occurrence is delivered exactly
once (issue 27) — claimed with a lease (FOR UPDATE SKIP LOCKED), one Lark uuid per occurrence."""

from __future__ import annotations

import asyncio
import collections
import time
from datetime import datetime
from zoneinfo import ZoneInfo

import pytest

from storage import database
from memory.schedules.store import ScheduleStore
from tests.reliability.support import wait_until

pytestmark = pytest.mark.timeout(240)
TZ = "Europe/Berlin"
JOBS = 30


async def test_three_replicas_deliver_each_occurrence_exactly_once(fleet, lark):
    db = await database(fleet.database_url).open()       # migrates, as a replica would
    try:
        store = ScheduleStore(db)
        # after the replicas are up: three starts on a loaded 2-core machine, each through the
        # delay proxy (tests/replicas/conftest.py), took over 20 s — then every reminder is "late"
        due = int(time.time()) + 45
        local = datetime.fromtimestamp(due, ZoneInfo(TZ)).replace(tzinfo=None).isoformat()
        jobs = [await store.add(owner_id=f"ou_{i}", chat_id=f"oc_rem_{i % 5}", chat_type="p2p",
                                text=f"reminder-{i}", tz=TZ, dtstart=local) for i in range(JOBS)]
    finally:
        await db.close()
    await fleet.start(3)
    sent = lambda: [m for m in lark.messages() if m.kind == "create" and m.text.startswith("reminder-")]  # noqa: E731
    await wait_until(lambda: len(sent()) >= JOBS, 120, "every reminder")
    await asyncio.sleep(3)                                  # a double would have arrived by now
    # a replica slow to start (a loaded machine) sends it marked late: count the reminder's own line
    counts = collections.Counter(m.text.split("\n", 1)[0] for m in sent())
    assert counts == {f"reminder-{i}": 1 for i in range(JOBS)}
    # each sent by one request: no replica sent an occurrence another had sent
    uuids = collections.Counter(c.json.get("uuid") for c in lark.calls_to("/open-apis/im/v1/messages", "POST")
                                if isinstance(c.json, dict) and str(c.json.get("uuid", "")).startswith("rem-"))
    assert set(uuids) == {f"rem-{j.id}-{int(j.next_due)}" for j in jobs}
    assert max(uuids.values()) == 1, uuids.most_common(3)
    senders = collections.Counter()
    for srv in fleet.replicas:
        senders[srv.extra_env["ETHAN_REPLICA_ID"]] = sum(1 for e in srv.entries() if e.get("event") == "reminder.sent")
    assert sum(senders.values()) == JOBS, senders
    assert not fleet.errors()
