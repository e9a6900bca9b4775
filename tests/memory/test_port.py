"""The storage port's own contract (storage/port.py), the same test on both engines: units of
work and transactions are atomic, roll back on error, join when nested, and are invisible to
other readers until they commit; ``ping``; ``backup_to`` on each engine; the engines implement
the declared Protocol."""

from __future__ import annotations

import asyncio
import sqlite3

import pytest

from storage import (Connection, Database, DatabaseError, NotSupported, database, execute_last, is_database_error,
                     serialize)


def _count(conn, actor: str | None = None) -> int:
    if actor is None:
        return conn.execute("SELECT COUNT(*) FROM audit").fetchone()[0]
    return conn.execute("SELECT COUNT(*) FROM audit WHERE actor = ?", (actor,)).fetchone()[0]


def _two_rows(conn, tag: str) -> int:
    conn.execute("INSERT INTO audit(at, actor, action) VALUES (0, ?, 'first')", (tag,))
    conn.execute("INSERT INTO audit(at, actor, action) VALUES (0, ?, 'second')", (tag,))
    return _count(conn, tag)


def _fail_after_one(conn) -> None:
    conn.execute("INSERT INTO audit(at, actor, action) VALUES (0, 'half', 'first')")
    raise RuntimeError("boom")


async def test_the_engines_implement_the_declared_port(db):
    assert isinstance(db, Database)
    assert db.dialect in ("sqlite", "postgres")
    await db.ping()
    # what a unit of work is given, reading and writing
    assert await db.read(lambda conn: isinstance(conn, Connection))
    assert await db.write(lambda conn: isinstance(conn, Connection))


async def test_a_write_unit_is_atomic(db):
    assert await db.write(_two_rows, "w") == 2
    with pytest.raises(RuntimeError):
        await db.write(_fail_after_one)
    assert await db.read(_count, "half") == 0
    assert await db.read(_count) == 2


async def test_a_transaction_rolls_back_on_error(db):
    with pytest.raises(RuntimeError):
        async with db.transaction() as tx:
            await tx.execute("INSERT INTO audit(at, actor, action) VALUES (0, 'x', 'y')")
            raise RuntimeError("boom")
    assert (await db.fetchone("SELECT COUNT(*) FROM audit"))[0] == 0


async def test_a_transaction_commits_every_statement_or_none(db):
    async def writer(i: int) -> None:
        async with db.transaction() as tx:
            await tx.execute("INSERT INTO audit(at, actor, action) VALUES (?, ?, 'start')", (i, str(i)))
            await asyncio.sleep(0)
            await tx.execute("INSERT INTO audit(at, actor, action) VALUES (?, ?, 'end')", (i, str(i)))
            if i % 3 == 0:
                raise RuntimeError("boom")

    results = await asyncio.gather(*(writer(i) for i in range(9)), return_exceptions=True)
    assert sum(isinstance(r, RuntimeError) for r in results) == 3
    rows = await db.fetchall("SELECT actor, COUNT(*) AS n FROM audit GROUP BY actor ORDER BY actor")
    assert [(r["actor"], r["n"]) for r in rows] == [(str(i), 2) for i in range(9) if i % 3]


async def test_a_write_inside_a_transaction_joins_it_and_others_see_it_only_after_commit(db):
    seen: list[int] = []

    async def reader() -> None:
        seen.append(await db.read(_count))

    async with db.transaction() as tx:
        await tx.execute("INSERT INTO audit(at, actor, action) VALUES (0, 'outer', 'x')")
        assert await db.write(_two_rows, "inner") == 2        # joined: no nested BEGIN
        task = asyncio.create_task(reader())
        await asyncio.sleep(0.05)
        # SQLite's reader waits for the commit; PostgreSQL's reads the snapshot before it
        assert seen in ([], [0])
    await task
    assert await db.read(_count) == 3
    assert seen[0] in (0, 3)


async def test_a_closed_database_refuses_in_one_line(db_target):
    d = await database(db_target).open()
    await d.close()
    assert not d.is_open
    with pytest.raises(DatabaseError):
        await d.ping()


async def test_backup_to_copies_sqlite_and_is_refused_on_postgres_in_one_line(db, tmp_path):
    await db.execute("INSERT INTO audit(at, actor, action) VALUES (0, 'kept', 'x')")
    dest = tmp_path / "backup" / "copy.db"
    if db.dialect == "postgres":
        with pytest.raises(NotSupported, match="pg_dump"):
            await db.backup_to(dest)
        assert not dest.exists()
        return
    await db.backup_to(dest)
    copy = sqlite3.connect(str(dest))
    try:
        assert copy.execute("SELECT actor FROM audit").fetchall() == [("kept",)]
    finally:
        copy.close()


async def test_fetch_each_answers_every_statement_in_one_round_trip(db):
    """The reads one message makes of several stores, sent together: each statement's rows in
    order, a changing statement among them committed, one round trip on both engines — also
    once its statements are prepared (PostgreSQL prepares from the second use) — and a failing
    statement raises without leaving the engine unusable."""
    from tests.round_trips import counting_round_trips
    await db.execute("INSERT INTO audit(at, actor, action) VALUES (1, 'ann', 'a1')")
    await db.execute("INSERT INTO audit(at, actor, action) VALUES (2, 'bob', 'b1')")
    statements = [
        ("SELECT action FROM audit WHERE actor = ? ORDER BY at", ("ann",)),
        ("SELECT action FROM audit WHERE actor = ? ORDER BY at", ("nobody",)),
        ("UPDATE audit SET at = ? WHERE actor = ? RETURNING action", (9, "bob")),
        ("SELECT COUNT(*) AS n FROM audit", ()),
    ]
    for _ in range(3):
        with counting_round_trips(db) as trips:
            ann, nobody, bob, count = await db.fetch_each(statements, write=True)
        assert trips["n"] == 1, trips
        assert [r["action"] for r in ann] == ["a1"] and nobody == [] and [r[0] for r in bob] == ["b1"]
        assert count[0]["n"] == 2
    assert (await db.fetchone("SELECT at FROM audit WHERE actor = 'bob'"))["at"] == 9
    with pytest.raises(Exception) as failed:
        await db.fetch_each([("SELECT 1", ()), ("SELECT * FROM no_such_table", ()), ("SELECT 2", ())])
    assert is_database_error(failed.value) and "no_such_table" in str(failed.value)
    assert [r[0] for r in (await db.fetch_each([("SELECT actor FROM audit ORDER BY at", ())]))[0]] == ["ann", "bob"]


def _two_rows_last(conn, tag: str) -> int:
    conn.execute("INSERT INTO audit(at, actor, action) VALUES (0, ?, 'first')", (tag,))
    return execute_last(conn, "INSERT INTO audit(at, actor, action) VALUES (0, ?, 'second') RETURNING id",
                        (tag,)).fetchone()[0]


def _locked_one_last(conn, tag: str) -> int:
    serialize(conn, "user", tag)
    return execute_last(conn, "INSERT INTO audit(at, actor, action) VALUES (0, ?, 'only')", (tag,)).rowcount


def _last_fails(conn) -> None:
    conn.execute("INSERT INTO audit(at, actor, action) VALUES (0, 'undone', 'first')")
    execute_last(conn, "INSERT INTO no_such_table VALUES (1)")


def _after_last(conn) -> None:
    execute_last(conn, "SELECT 1")
    conn.execute("INSERT INTO audit(at, actor, action) VALUES (0, 'late', 'x')")


def _insert_then_update_last(conn, row_id: int) -> int:
    conn.execute("INSERT INTO audit(at, actor, action) VALUES (0, 'waiter', 'first')")
    return execute_last(conn, "UPDATE audit SET action = 'after' WHERE id = ?", (row_id,)).rowcount


async def test_a_unit_waiting_for_a_lock_at_its_last_statement_leaves_the_process_running(db):
    """A unit whose last statement (with its COMMIT, one pipeline on PostgreSQL) waits for a
    row another transaction of this process holds: the event loop and the other threads go on
    while it waits — the holder commits, the waiter follows, first time. psycopg's
    ``get_result`` blocks holding the GIL, so reading a pipeline's results that way froze the
    whole process until the lock timeout (2 s) broke the wait: every webhook of the process
    missed Lark's deadline (CI's 503s in tests/replicas)."""
    row_id = await db.write(lambda conn: conn.execute(
        "INSERT INTO audit(at, actor, action) VALUES (0, 'holder', 'before')").lastrowid)
    retries = db.stats.retries if db.dialect == "postgres" else 0
    ticks: list[float] = []
    loop = asyncio.get_running_loop()
    async with db.transaction() as tx:
        await tx.execute("UPDATE audit SET action = 'held' WHERE id = ?", (row_id,))
        waiter = asyncio.ensure_future(db.write(_insert_then_update_last, row_id))
        for _ in range(10):         # the loop runs while the waiter waits in the database
            await asyncio.sleep(0.02)
            ticks.append(loop.time())
        assert not waiter.done()
    assert await asyncio.wait_for(waiter, 30) == 1
    gaps = [b - a for a, b in zip(ticks, ticks[1:])]
    assert await db.read(lambda conn: conn.execute("SELECT action FROM audit WHERE id = ?",
                                                   (row_id,)).fetchone()[0]) == "after"
    if db.dialect == "postgres":
        # The wait ended by the holder's COMMIT, not by the lock timeout and a replay.
        assert db.stats.retries == retries, f"replayed after a lock timeout; gaps between ticks {gaps}"


async def test_execute_last_ends_the_unit_in_its_own_round_trip(db):
    """``port.execute_last``: the unit's statements commit together, with one round trip fewer
    on PostgreSQL (no COMMIT of its own; a one-statement unit, its lock too, is one); a failing
    last statement undoes the whole unit and leaves the engine usable; a statement after it is
    refused (it would run outside the unit); inside ``transaction()`` it commits nothing."""
    from tests.round_trips import counting_round_trips
    pg = db.dialect == "postgres"
    for i in range(3):      # also once PostgreSQL has prepared the statements
        with counting_round_trips(db) as trips:
            assert await db.write(_two_rows_last, f"w{i}")
        assert trips["n"] == (2 if pg else 1), trips
        with counting_round_trips(db) as trips:
            assert await db.write(_locked_one_last, f"l{i}") == 1
        assert trips["n"] == 1, trips
        with counting_round_trips(db) as trips:
            assert await db.read(lambda conn: execute_last(conn, "SELECT COUNT(*) FROM audit").fetchone()[0])
        assert trips["n"] == 1, trips
    assert await db.read(_count) == 9
    with pytest.raises(Exception) as failed:
        await db.write(_last_fails)
    assert is_database_error(failed.value) and "no_such_table" in str(failed.value)
    assert await db.read(_count, "undone") == 0
    if pg:
        with pytest.raises(AssertionError, match="after the unit"):
            await db.write(_after_last)
        assert await db.read(_count, "late") == 0
    with pytest.raises(RuntimeError):
        async with db.transaction():
            await db.write(_two_rows_last, "in-tx")       # joins the transaction: no COMMIT
            raise RuntimeError("boom")
    assert await db.read(_count, "in-tx") == 0
    assert await db.read(_count) == 9


def _two_reads(conn, row_id):
    a = conn.execute("SELECT action FROM audit WHERE id = ?", (row_id,)).fetchone()[0]
    return a, conn.execute("SELECT count(*) FROM audit WHERE id <= ?", (row_id,)).fetchone()[0]


def _two_writes(conn, row_id, action):
    conn.execute("UPDATE audit SET actor = 'unit' WHERE id = ?", (row_id,))
    return conn.execute("UPDATE audit SET action = ? WHERE id = ?", (action, row_id)).rowcount


def _two_appends(conn, row_id):
    conn.execute("UPDATE audit SET actor = 'unit' WHERE id = ?", (row_id,))
    return conn.execute("UPDATE audit SET action = action || ' +2' WHERE id = ?", (row_id,)).rowcount


def _write_then_sleep(conn):
    conn.execute("INSERT INTO audit(at, actor, action) VALUES (0, 'cancelled', 'never')")
    conn.execute("SELECT pg_sleep(30)")


async def test_units_run_on_the_event_loop_and_a_cancelled_one_costs_nothing_else(db):
    """PostgreSQL: every unit — one statement (``fetchone``/``fetchall``/``execute``/
    ``fetch_each``) or a store's function of several (``read``, ``write``, ``executemany``) —
    is sent and read by the event loop itself: no hop to a worker thread (a hop cost more CPU
    than a statement), while the loop goes on serving others. A unit waiting for a row that a
    transaction of this process holds leaves the loop ticking, and follows the holder's COMMIT.
    Cancelled mid-statement, a unit gives back its slot and its connection (closed: the server
    rolls back what it wrote, and no unread result can reach the next user); every later unit
    is served."""
    if db.dialect != "postgres":
        pytest.skip("SQLite's units all run in its one thread")
    row_id = await db.insert("INSERT INTO audit(at, actor, action) VALUES (0, 'holder', 'before')")
    hops: list[str] = []
    executor = db._executor
    submit = executor.submit

    def counted(fn, *a, **kw):
        hops.append(getattr(fn, "__qualname__", repr(fn)))
        return submit(fn, *a, **kw)
    executor.submit = counted
    try:
        for _ in range(3):      # also once the statements are prepared
            assert (await db.fetchone("SELECT action FROM audit WHERE id = ?", (row_id,)))[0] == "before"
            assert len(await db.fetchall("SELECT id FROM audit WHERE id <= ?", (row_id,))) == 1
            assert await db.execute("UPDATE audit SET actor = 'holder' WHERE id = ?", (row_id,)) == 1
            assert await db.fetch_each([("SELECT 1", ()), ("SELECT 2", ())]) == [[(1,)], [(2,)]]
            assert await db.read(_two_reads, row_id) == ("before", 1)
            assert await db.write(_two_writes, row_id, "before") == 1
            await db.executemany("INSERT INTO audit(at, actor, action) VALUES (1, ?, 'many')", [("a",), ("b",)])
        from storage.postgres.wire import EXECUTEMANY_BATCH
        many = [(f"r{i}",) for i in range(2 * EXECUTEMANY_BATCH + 1)]     # three pipelines
        await db.executemany("INSERT INTO audit(at, actor, action) VALUES (2, ?, 'batch')", many)
        assert hops == [], f"units hopped to a worker thread: {hops}"
    finally:
        executor.submit = submit
    assert (await db.fetchone("SELECT count(*) FROM audit WHERE action = 'many'"))[0] == 6
    assert [r[0] for r in await db.fetchall("SELECT actor FROM audit WHERE action = 'batch' ORDER BY id")] == \
        [a for (a,) in many]

    # the pool grows on demand: with fewer idle connections than units below, a unit would
    # take the worker path (which blocks no loop) and this part would test nothing
    for _ in range(50):
        if db._pool.get_stats().get("pool_available", 0) >= 3:
            break
        await asyncio.gather(*(db.fetchone("SELECT pg_sleep(0.05)") for _ in range(4)))
    assert db._pool.get_stats().get("pool_available", 0) >= 3
    retries = db.stats.retries
    loop = asyncio.get_running_loop()
    ticks: list[float] = []
    async with db.transaction() as tx:
        await tx.execute("UPDATE audit SET action = 'held' WHERE id = ?", (row_id,))
        waiter = asyncio.ensure_future(db.execute("UPDATE audit SET action = action || ' +1' WHERE id = ?", (row_id,)))
        # a unit of several statements, waiting for the same row (which of the two PostgreSQL
        # lets go first is its own: both must apply, on top of the holder's commit)
        waiter2 = asyncio.ensure_future(db.write(_two_appends, row_id))
        for _ in range(10):
            await asyncio.sleep(0.02)
            ticks.append(loop.time())
        assert not waiter.done() and not waiter2.done()
    assert await asyncio.wait_for(waiter, 30) == 1
    assert await asyncio.wait_for(waiter2, 30) == 1
    assert db.stats.retries == retries, "the wait ended by the lock timeout and a replay, not the COMMIT"
    assert max(b - a for a, b in zip(ticks, ticks[1:])) < 1.0

    for unit in [lambda: db.fetchone("SELECT pg_sleep(30)"), lambda: db.write(_write_then_sleep)] * 2:
        slow = asyncio.ensure_future(unit())
        await asyncio.sleep(0.2)
        slow.cancel()
        with pytest.raises(asyncio.CancelledError):
            await slow
    assert db._slots._value == db.pool_size, "a cancelled unit kept its connection slot"
    rows = await asyncio.wait_for(asyncio.gather(*(db.fetchone("SELECT ?::int", (i,)) for i in range(3 * db.pool_size))), 30)
    assert [r[0] for r in rows] == list(range(3 * db.pool_size))
    assert (await db.fetchone("SELECT action FROM audit WHERE id = ?", (row_id,)))[0] in ("held +1 +2", "held +2 +1")
    assert (await db.fetchone("SELECT count(*) FROM audit WHERE actor = 'cancelled'"))[0] == 0, \
        "a cancelled unit's write was committed"
