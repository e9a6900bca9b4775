"""bot.inbox: acknowledged means committed; group commit under a burst; dedup inside a batch."""

from __future__ import annotations

import asyncio

import pytest

from bot.inbox import Inbox
from memory.db import Database
from tests.round_trips import counting_round_trips


@pytest.fixture
async def db(tmp_path):
    d = await Database(tmp_path / "inbox.db").open()
    yield d
    await d.close()


def _event(i: int, *, message: int | None = None) -> dict:
    m = i if message is None else message
    return dict(event_id=f"ev_{i}", message_id=f"om_{m}", chat_id=f"oc_{m % 7}", conv_key=f"oc_{m % 7}",
                create_time=1_700_000_000.0 + i, payload=f'{{"i": {i}}}')


async def test_a_burst_is_committed_in_a_few_round_trips_and_every_row_is_there(db):
    inbox = Inbox(db)
    with counting_round_trips(db) as trips:
        items = await asyncio.gather(*(inbox.accept(**_event(i)) for i in range(100)))
    assert all(item is not None for item in items)
    assert trips["n"] <= 3, trips                    # group commit, not 100 (or 300) hops
    rows = await db.fetchall("SELECT id, event_id FROM inbox ORDER BY id")
    assert [r["event_id"] for r in rows] == [f"ev_{i}" for i in range(100)]   # arrival order
    assert [item.id for item in items] == [r["id"] for r in rows]


async def test_duplicates_inside_one_batch_and_across_batches_are_refused(db):
    inbox = Inbox(db)
    first = await asyncio.gather(
        inbox.accept(**_event(1)),
        inbox.accept(**_event(1)),                 # the same event twice in one batch
        inbox.accept(**_event(2, message=1)),      # the same message under another event id
        inbox.accept(**_event(3)),
    )
    assert [x is not None for x in first] == [True, False, False, True]
    again = await inbox.accept(**_event(3))
    assert again is None
    assert (await db.fetchone("SELECT COUNT(*) FROM inbox"))[0] == 2


async def test_a_failed_commit_fails_every_waiting_event_and_stores_none(db):
    inbox = Inbox(db)
    await db.conn.execute("CREATE TRIGGER no_inbox BEFORE INSERT ON inbox BEGIN SELECT RAISE(ABORT, 'disk full'); END")
    results = await asyncio.gather(*(inbox.accept(**_event(i)) for i in range(5)), return_exceptions=True)
    assert all(isinstance(r, Exception) for r in results)
    await db.conn.execute("DROP TRIGGER no_inbox")
    assert (await db.fetchone("SELECT COUNT(*) FROM inbox"))[0] == 0
    assert await inbox.accept(**_event(9)) is not None        # and the next one works
