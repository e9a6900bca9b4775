"""bot.delivery.inbox_store: acknowledged means committed; group commit under a burst; dedup
inside a batch — on both backends (PostgreSQL stores a batch in one statement)."""

from __future__ import annotations

import asyncio
import sqlite3

import pytest

from bot.delivery.inbox_store import Inbox, InboxItem
from storage.sqlite import SqliteDatabase
from tests.round_trips import counting_round_trips


def _event(i: int, *, message: int | None = None) -> dict:
    m = i if message is None else message
    return dict(event_id=f"ev_{i}", message_id=f"om_{m}", chat_id=f"oc_{m % 7}", conv_key=f"oc_{m % 7}",
                create_time=1_700_000_000.0 + i, payload=f'{{"i": {i}}}')


@pytest.mark.parametrize("conversations", [False, True], ids=["one-process", "replicas"])
async def test_a_burst_is_committed_in_a_few_round_trips_and_every_row_is_there(db, conversations):
    inbox = Inbox(db, conversations=conversations)
    with counting_round_trips(db) as trips:
        items = await asyncio.gather(*(inbox.accept(**_event(i)) for i in range(100)))
    assert all(item is not None for item in items)
    # group commit, not 100 (or 300) round trips: the 100 events are one batch (all queued
    # before its flush runs); on PostgreSQL the leases (with the replicas' conversations), then
    # the rows with the COMMIT (one statement alone needs no BEGIN)
    if db.dialect == "sqlite":
        assert trips["n"] <= 3, trips
    else:
        assert trips["n"] == (2 if conversations else 1), trips
    rows = await db.fetchall("SELECT id, event_id FROM inbox ORDER BY id")
    assert [r["event_id"] for r in rows] == [f"ev_{i}" for i in range(100)]   # arrival order
    assert [item.id for item in items] == [r["id"] for r in rows]
    if conversations:
        assert all(item.held for item in items)         # nobody else holds these conversations
        leases = await db.fetchall("SELECT conv_key, owner FROM conversation_leases ORDER BY conv_key")
        assert [(r["conv_key"], r["owner"]) for r in leases] == [(f"oc_{k}", inbox.owner) for k in range(7)]


async def test_a_batch_leaves_a_conversation_held_elsewhere_to_its_holder(db):
    a = Inbox(db, owner="A", conversations=True)
    b = Inbox(db, owner="B", conversations=True)
    assert await b.hold("oc_1")
    items = await asyncio.gather(*(a.accept(**_event(i)) for i in range(14)))
    assert {i.conv_key for i in items if not i.held} == {"oc_1"}
    owners = {r["event_id"]: r["owner"] for r in await db.fetchall("SELECT event_id, owner FROM inbox")}
    assert owners["ev_1"] is None and owners["ev_8"] is None        # unowned: B answers them
    assert owners["ev_2"] == "A"


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


async def test_a_row_that_breaks_a_constraint_fails_alone(db):
    """One bad row (here: no create_time) in a group commit gets its error (the webhook answers
    503 for it); the rest of the batch is stored."""
    inbox = Inbox(db)
    events = [_event(i) for i in range(6)]
    events[3]["create_time"] = None
    results = await asyncio.gather(*(inbox.accept(**e) for e in events), return_exceptions=True)
    assert sum(isinstance(r, InboxItem) for r in results) == 5
    # storage.IntegrityError (PostgreSQL) is a sqlite3.IntegrityError (what SQLite raises)
    assert isinstance(results[3], sqlite3.IntegrityError), results[3]
    rows = await db.fetchall("SELECT event_id FROM inbox ORDER BY id")
    assert [r["event_id"] for r in rows] == ["ev_0", "ev_1", "ev_2", "ev_4", "ev_5"]


_FAIL_INSERTS = {
    "sqlite": ["CREATE TRIGGER no_inbox BEFORE INSERT ON inbox BEGIN SELECT RAISE(ABORT, 'disk full'); END"],
    "postgres": ["CREATE FUNCTION no_inbox() RETURNS trigger LANGUAGE plpgsql AS"
                 " $$ BEGIN RAISE EXCEPTION 'disk full'; END $$",
                 "CREATE TRIGGER no_inbox BEFORE INSERT ON inbox FOR EACH ROW EXECUTE FUNCTION no_inbox()"],
}


async def test_a_failed_commit_fails_every_waiting_event_and_stores_none(db):
    inbox = Inbox(db)
    for sql in _FAIL_INSERTS[db.dialect]:
        await db.execute(sql)
    results = await asyncio.gather(*(inbox.accept(**_event(i)) for i in range(5)), return_exceptions=True)
    assert all(isinstance(r, Exception) for r in results)
    await db.execute("DROP TRIGGER no_inbox" + (" ON inbox" if db.dialect == "postgres" else ""))
    assert (await db.fetchone("SELECT COUNT(*) FROM inbox"))[0] == 0
    assert await inbox.accept(**_event(9)) is not None        # and the next one works


async def test_dedup_is_keyed_on_the_event_and_v3_databases_migrate(tmp_path):
    """A recall (a later event about a stored message) is not its duplicate; a re-send of
    the message is. A database made before dedup_key keeps its rows as 'msg:' keys."""
    import sqlite3
    import time

    from storage.sqlite import _split_sql
    from storage.schema import MIGRATIONS

    path = tmp_path / "v3.db"
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE schema_version (version INTEGER NOT NULL, applied_at REAL NOT NULL)")
    for version, script in enumerate(MIGRATIONS[:3], 1):
        for stmt in _split_sql(script):
            conn.execute(stmt)
        conn.execute("INSERT INTO schema_version VALUES (?, ?)", (version, time.time()))
    conn.execute("INSERT INTO inbox(event_id, message_id, chat_id, conv_key, create_time, received_at, payload)"
                 " VALUES ('ev_old', 'om_old', 'oc_1', 'oc_1', 1, 1, '{}')")
    conn.commit()
    conn.close()
    d = await SqliteDatabase(path).open()
    try:
        row = await d.fetchone("SELECT id, dedup_key, event_type FROM inbox WHERE event_id = 'ev_old'")
        assert (row["id"], row["dedup_key"], row["event_type"]) == (1, "msg:om_old", "im.message.receive_v1")
        inbox = Inbox(d)
        base = dict(chat_id="oc_1", conv_key="oc_1", create_time=2.0, payload="{}")
        assert await inbox.accept(event_id="ev_again", message_id="om_old", **base) is None        # re-sent
        recall = await inbox.accept(event_id="ev_recall", message_id="om_old", event_type="im.message.recalled_v1",
                                    dedup_key="recall:om_old", **base)
        assert recall is not None and recall.event_type == "im.message.recalled_v1"
        assert await inbox.accept(event_id="ev_recall2", message_id="om_old", dedup_key="recall:om_old",
                                  **base) is None                                                 # its redelivery
    finally:
        await d.close()
