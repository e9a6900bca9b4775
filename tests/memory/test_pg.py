"""storage/postgres/wire.py's own wire path on a real throwaway PostgreSQL (tests/pg_cluster.py): no lock
shared by every writer, a per-key lock held from ``serialize`` to the unit's commit, rollback and reuse of a connection after a
failed first statement, client-side binding of one-statement writes, prepared statements."""

from __future__ import annotations

import asyncio

import psycopg
import pytest

from storage import IntegrityError, database, serialize


@pytest.fixture
def backend() -> str:
    return "postgres"


@pytest.fixture
async def one(db_target):
    """A database with one pooled connection, so every unit reuses the same session."""
    d = await database(db_target, pool_size=1).open()
    try:
        await d.execute("CREATE TABLE wire (k TEXT PRIMARY KEY, n BIGINT, f DOUBLE PRECISION)")
        yield d
    finally:
        await d.close()


def _key_is_free(url: str, key: str) -> bool:
    with psycopg.connect(url, autocommit=True) as other:
        free = other.execute("SELECT pg_try_advisory_xact_lock(hashtextextended(%s, 0))", (key,)).fetchone()[0]
        return free


async def test_a_unit_holds_its_keys_lock_from_the_call_to_its_commit_and_no_other(one):
    seen = {}

    def unit(conn):
        conn.execute("INSERT INTO wire(k, n) VALUES (?, ?)", ("a", 1))      # BEGIN goes with it
        seen["before"] = _key_is_free(one.url, "user:ou_a")
        serialize(conn, "user", "ou_a")
        seen["during"] = _key_is_free(one.url, "user:ou_a")
        seen["other key"] = _key_is_free(one.url, "user:ou_b")
        conn.execute("UPDATE wire SET n = n + 1 WHERE k = ?", ("a",))
        return conn.execute("SELECT n FROM wire WHERE k = ?", ("a",)).fetchone()["n"]

    assert await one.write(unit) == 2
    assert seen == {"before": True, "during": False, "other key": True}
    assert _key_is_free(one.url, "user:ou_a")
    # the unit committed as one: another connection sees its end state
    with psycopg.connect(one.url, autocommit=True) as other:
        assert other.execute("SELECT n FROM wire WHERE k = 'a'").fetchone()[0] == 2


async def test_write_units_take_no_lock_shared_by_every_writer(db_target):
    """Two write units run at once (issue 29: the global WRITE_LOCK is gone): the first waits,
    mid-transaction, for the second to commit — with one lock for all writers it never could."""
    d = await database(db_target, pool_size=2).open()
    try:
        await d.execute("CREATE TABLE pair (k TEXT PRIMARY KEY)")

        def first(conn):
            # waits at the database (a unit's only waits are there: it may run on the event
            # loop) until the second's row is committed, which READ COMMITTED then shows
            conn.execute("INSERT INTO pair(k) VALUES ('first')")
            for _ in range(250):
                if conn.execute("SELECT count(*) FROM pair WHERE k = 'second'").fetchone()[0]:
                    return True
                conn.execute("SELECT pg_sleep(0.02)")
            return False

        def second(conn):
            conn.execute("INSERT INTO pair(k) VALUES ('second')")
            return True

        async def later():
            await asyncio.sleep(0.1)
            return await d.write(second)

        assert await asyncio.gather(d.write(first), later()) == [True, True]
    finally:
        await d.close()


async def test_a_failed_first_statement_rolls_back_and_the_connection_is_reused(one):
    await one.execute("INSERT INTO wire(k, n) VALUES (?, ?)", ("dup", 1))

    def unit(conn):
        serialize(conn, "user", "ou_dup")
        conn.execute("INSERT INTO wire(k, n) VALUES (?, ?)", ("dup", 2))
        conn.execute("INSERT INTO wire(k, n) VALUES (?, ?)", ("never", 3))

    with pytest.raises(IntegrityError):
        await one.write(unit)
    # same (only) connection: no aborted transaction left on it, the key's lock released
    assert _key_is_free(one.url, "user:ou_dup")
    assert await one.execute("UPDATE wire SET n = ? WHERE k = ?", (5, "dup")) == 1
    rows = await one.fetchall("SELECT k, n FROM wire ORDER BY k")
    assert [(r["k"], r["n"]) for r in rows] == [("dup", 5)]


@pytest.mark.parametrize("text", ["it's", "back\\slash", "100% sure?", "'; DROP TABLE wire; --",
                                  "中文 and emoji 🙂", "", "$1 $$ ::text"])
async def test_one_statement_writes_bind_any_text_literally(one, text):
    # execute() is one locked implicit transaction with client-side bound parameters
    assert await one.execute("INSERT INTO wire(k, n, f) VALUES (?, ?, ?)", (text, 2**40, 0.1)) == 1
    assert await one.execute("UPDATE wire SET f = ? WHERE k = ? AND n = ?", (None, text, 2**40)) == 1
    row = await one.fetchone("SELECT k, n, f FROM wire WHERE k = ?", (text,))
    assert (row["k"], row["n"], row["f"]) == (text, 2**40, None)


async def test_one_statement_writes_raise_the_ports_integrity_error(one):
    await one.execute("INSERT INTO wire(k) VALUES (?)", ("x",))
    with pytest.raises(IntegrityError):
        await one.execute("INSERT INTO wire(k) VALUES (?)", ("x",))
    assert await one.execute("INSERT OR IGNORE INTO wire(k) VALUES (?)", ("x",)) == 0


async def test_a_prepared_statement_keeps_answering_right_for_other_parameter_types(one):
    # from its second use a statement is prepared, per parameter types (None, small, big int)
    for i, n in enumerate([None, 1, None, 7, 2**40, 3, None]):
        await one.execute("INSERT INTO wire(k, n) VALUES (?, ?)", (f"k{i}", n))
    for _ in range(3):
        for n, want in [(1, ["k1"]), (7, ["k3"]), (2**40, ["k4"])]:
            rows = await one.fetchall("SELECT k FROM wire WHERE n = ? ORDER BY k", (n,))
            assert [r["k"] for r in rows] == want
        rows = await one.fetchall("SELECT k FROM wire WHERE n IS NULL ORDER BY k")
        assert [r[0] for r in rows] == ["k0", "k2", "k6"]


def test_a_raw_driver_error_counts_as_a_database_error():
    """A psycopg error that a store let through untranslated is still retried / a 503."""
    import psycopg
    import psycopg_pool

    from storage import is_database_error

    assert is_database_error(psycopg.OperationalError("server closed the connection unexpectedly"))
    assert is_database_error(psycopg.errors.AdminShutdown("terminating connection"))
    assert is_database_error(psycopg_pool.PoolTimeout("couldn't get a connection"))
    wrapped = RuntimeError("store failed")
    wrapped.__cause__ = psycopg.InterfaceError("the connection is closed")
    assert is_database_error(wrapped)
    assert not is_database_error(RuntimeError("a bug"))
    assert not is_database_error(ValueError("bad input"))
