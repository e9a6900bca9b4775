"""``Database.write_first`` (storage/queueing.py): the inbox's commit, which an acknowledgement to
Lark waits for, is served before writes already waiting for the database — SQLite's one writer,
PostgreSQL's pool — on both engines; and the priority semaphore under it keeps every permit
through cancellations."""

from __future__ import annotations

import asyncio

import pytest

from storage import database
from storage.queueing import PrioritySemaphore


def _insert(conn, actor: str) -> None:
    conn.execute("INSERT INTO audit(at, actor, action) VALUES (0, ?, 'write')", (actor,))


HOLD_KEY = 0x686F6C64


def _hold(conn, started, release) -> None:
    """A unit that keeps the writer (SQLite) or the one connection (PostgreSQL) busy. On
    PostgreSQL it waits at the database, for an advisory lock the test holds: a unit may run on
    the event loop (storage/postgres/database.py ``_on_loop``), where a thread's wait would stop it."""
    conn.execute("INSERT INTO audit(at, actor, action) VALUES (0, 'holder', 'write')")
    started.set()
    if getattr(conn, "dialect", "sqlite") == "postgres":
        conn.execute(f"SELECT pg_advisory_xact_lock({HOLD_KEY})")
    else:
        release.wait(10)


@pytest.fixture
async def one_writer(db_target):
    """A database where one unit at a time runs: SQLite always, PostgreSQL with a pool of one."""
    d = await database(db_target, **({"pool_size": 1} if isinstance(db_target, str) else {})).open()
    try:
        yield d
    finally:
        await d.close()


async def test_write_first_goes_ahead_of_the_writes_already_waiting(one_writer):
    import threading
    db = one_writer
    started, release = threading.Event(), threading.Event()
    lock = None
    if db.dialect == "postgres":
        import psycopg
        lock = psycopg.connect(db.url, autocommit=True)
        lock.execute(f"SELECT pg_advisory_lock({HOLD_KEY})")
    holder = asyncio.ensure_future(db.write(_hold, started, release))
    await asyncio.to_thread(started.wait, 10)
    queued = []
    for i in range(5):
        queued.append(asyncio.ensure_future(db.write(_insert, f"reply{i}")))
        await asyncio.sleep(0.01)           # each in the queue, in this order
    urgent = asyncio.ensure_future(db.write_first(_insert, "inbox"))
    await asyncio.sleep(0.01)
    release.set()
    if lock is not None:
        lock.close()
    await asyncio.gather(holder, urgent, *queued)
    order = [r["actor"] for r in await db.fetchall("SELECT actor FROM audit ORDER BY id")]
    assert order == ["holder", "inbox", "reply0", "reply1", "reply2", "reply3", "reply4"]


async def test_the_urgent_queue_is_served_first_and_each_queue_in_order():
    sem = PrioritySemaphore(1)
    await sem.acquire()
    served: list[str] = []

    async def take(name: str, first: bool) -> None:
        await sem.acquire(first)
        served.append(name)
        sem.release()

    tasks = []
    for name, first in [("a", False), ("b", False), ("X", True), ("c", False), ("Y", True)]:
        tasks.append(asyncio.ensure_future(take(name, first)))
        await asyncio.sleep(0)
    sem.release()
    await asyncio.gather(*tasks)
    assert served == ["X", "Y", "a", "b", "c"]
    assert not sem.locked()


async def test_cancelled_waiters_lose_no_permit():
    sem = PrioritySemaphore(2)
    await sem.acquire()
    await sem.acquire()
    waiting = asyncio.ensure_future(sem.acquire(first=True))
    granted_then_cancelled = asyncio.ensure_future(sem.acquire())
    later = asyncio.ensure_future(sem.acquire())
    await asyncio.sleep(0)
    waiting.cancel()                     # cancelled in the queue: leaves it
    await asyncio.sleep(0)
    sem.release()                        # -> granted_then_cancelled, which is cancelled before it runs
    granted_then_cancelled.cancel()
    await asyncio.gather(waiting, granted_then_cancelled, return_exceptions=True)
    await asyncio.wait_for(later, 1)     # the permit was passed on
    sem.release()
    sem.release()
    assert not sem.locked()
    await sem.acquire()
    await sem.acquire()                  # both permits are there again
    assert sem.locked()
