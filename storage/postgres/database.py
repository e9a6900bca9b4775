"""PgDatabase: the storage port on PostgreSQL — the pool, units of work, transactions, retries.

The engine's core (the whole design: storage/postgres/__init__.py): a psycopg pool with a slot
per connection, each unit of work run on the event loop in a greenlet (or in a worker thread
when no connection is idle), read snapshots and write transactions, a lost race rolled back
and replayed, an outage mapped to DatabaseUnavailable, migrations at open, and the awaited
``transaction()``. The SQL dialect (translate.py), the wire (wire.py), the classification of
failed connections (outages.py), the URL (url.py) and the counters (stats.py) are apart.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, AsyncIterator, Callable, Iterable, Sequence, TypeVar

import greenlet
import psycopg
from psycopg_pool import ConnectionPool

from storage.queueing import PrioritySemaphore
from storage.port import DatabaseError, DatabaseUnavailable, NotSupported, RetryLater, SchemaTooNew
from storage.postgres.outages import _is_outage, _unavailable
from storage.postgres.stats import UnitStats
from storage.postgres.url import connect_params
from storage.postgres.wire import Connection, Cursor, _BoolAsInt, _NumericLoader, _pipelined, _ready, _row_factory
from storage.schema.postgres import PG_MIGRATIONS

T = TypeVar("T")
MIGRATE_LOCK = 0x45746862    # concurrent `ethan serve` starts migrate one at a time
DEFAULT_POOL = 16
# How long a unit waits for a pooled connection before it is DatabaseUnavailable (a 503 at the
# webhook): under Lark's 3 s with room for the rest of the request, so during an outage Lark
# gets its 503 in time and redelivers, instead of no answer at all.
CHECKOUT_TIMEOUT = 2.5
# Connections are in autocommit mode and transactions are begun by hand, so that BEGIN goes in
# one pipeline with the unit's first statement (psycopg's implicit BEGIN would be a round trip
# of its own), and a one-statement read or write is one round trip (its own implicit transaction).
_BEGIN_WRITE = b"BEGIN"
_BEGIN_READ = b"BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY"
# Lost races PostgreSQL asks the client to replay: serialization_failure, deadlock_detected,
# and lock_not_available — a lock waited for longer than LOCK_TIMEOUT. PostgreSQL sees
# deadlocks among its own locks only; a unit blocked on a row that another replica's
# transaction holds while *it* waits for a free connection slot or thread of its process is a
# cycle no server can see. The lock timeout breaks it: the waiter rolls back (releasing what
# it held) and runs again.
RETRY_STATES = frozenset({"40001", "40P01", "55P03"})
LOCK_TIMEOUT_MS = 2000
RETRIES = 8


def _configure(raw: psycopg.Connection) -> None:
    raw.adapters.register_loader("numeric", _NumericLoader)
    raw.adapters.register_dumper(bool, _BoolAsInt)
    raw.execute(f"SET lock_timeout = {LOCK_TIMEOUT_MS}")   # see RETRY_STATES


class AsyncCursor:
    def __init__(self, rows: list, rowcount: int, lastrowid: int | None) -> None:
        self._rows = rows
        self.rowcount = rowcount
        self.lastrowid = lastrowid

    async def fetchone(self):
        return self._rows.pop(0) if self._rows else None

    async def fetchall(self) -> list:
        rows, self._rows = self._rows, []
        return rows

    async def close(self) -> None:
        self._rows = []

    def __aiter__(self):
        return self._iter()

    async def _iter(self):
        for r in await self.fetchall():
            yield r


class AsyncTransaction:
    """What ``Database.transaction()`` yields: aiosqlite's execute/execute_fetchall shape over
    the transaction's pooled connection (each statement one hop to a worker thread)."""
    dialect = "postgres"

    def __init__(self, db: "PgDatabase", conn: Connection) -> None:
        self._db = db
        self.conn = conn

    async def serialize(self, key: str) -> None:
        await self._db._hop(lambda: self.conn.serialize(key))

    async def execute(self, sql: str, params: Sequence[Any] = ()) -> AsyncCursor:
        def run():
            cur = self.conn.execute(sql, params)
            return AsyncCursor(cur.fetchall() if not cur.lastrowid else [], cur.rowcount, cur.lastrowid)
        return await self._db._hop(run)

    async def execute_fetchall(self, sql: str, params: Sequence[Any] = ()) -> list:
        return await self._db._hop(lambda: self.conn.execute(sql, params).fetchall())

    async def executemany(self, sql: str, rows: Iterable[Sequence[Any]]) -> None:
        rows = list(rows)
        await self._db._hop(lambda: self.conn.executemany(sql, rows))



def _backoff(attempt: int) -> float:
    """The random pause before replaying a unit that lost a race for the ``attempt``-th time."""
    return random.uniform(0, 0.002 * 2 ** min(attempt, 6))


def _lost_race(e: BaseException) -> bool:
    """A deadlock or serialization failure: nothing is wrong but the timing; run it again."""
    return (getattr(e, "sqlstate", None) or "") in RETRY_STATES


class PgDatabase:
    """The storage port (storage.port.Database) on PostgreSQL."""
    dialect = "postgres"

    def __init__(self, url: str, *, pool_size: int = DEFAULT_POOL, connect_timeout: float = 5.0) -> None:
        self.stats = UnitStats()
        self.url = url
        self.path = url
        self.pool_size = pool_size
        self.connect_timeout = connect_timeout
        self._pool: ConnectionPool | None = None
        self._executor: ThreadPoolExecutor | None = None
        self._tx: dict[asyncio.Task, Connection] = {}   # each open transaction() by its task
        self._slots: PrioritySemaphore | None = None    # see _slot
        self._checking = False                          # a check of idle connections is running

    async def open(self) -> "PgDatabase":
        self._executor = ThreadPoolExecutor(self.pool_size, thread_name_prefix="pg")
        self._slots = PrioritySemaphore(self.pool_size)
        params = connect_params(self.url)
        timeout = max(1, int(self.connect_timeout))
        self._pool = ConnectionPool(
            "", min_size=1, max_size=self.pool_size, open=False, configure=_configure,
            kwargs={**params, "row_factory": _row_factory, "autocommit": True, "connect_timeout": timeout},
            timeout=CHECKOUT_TIMEOUT, name="ethan")
        try:
            # One connection of our own first: its error says what is wrong (the login, the
            # database's name, the server), where the pool's open would only time out.
            await self._hop(lambda: psycopg.connect(**params, connect_timeout=timeout).close())
            await self._hop(lambda: self._pool.open(wait=True, timeout=self.connect_timeout))
            await self._hop(self._migrate)
        except BaseException as e:
            await self.close()
            if isinstance(e, (psycopg.OperationalError, psycopg_pool_timeout())):
                raise _unavailable(e) from e
            raise
        return self

    async def close(self) -> None:
        self._slots = None
        if self._pool is not None:
            pool, self._pool = self._pool, None
            await asyncio.get_running_loop().run_in_executor(self._executor, pool.close)
        if self._executor is not None:
            self._executor.shutdown(wait=False)
            self._executor = None

    async def start_checkpointer(self, interval: float = 0.5) -> None:
        """SQLite's WAL checkpoints have no PostgreSQL counterpart (the server does its own)."""

    @property
    def is_open(self) -> bool:
        return self._pool is not None

    # -- the worker pool -----------------------------------------------------------------
    async def _hop(self, fn: Callable[[], T]) -> T:
        if self._executor is None:
            raise DatabaseError("database is not open")
        try:
            return await asyncio.get_running_loop().run_in_executor(self._executor, fn)
        except psycopg.Error as e:
            unavailable = self._outage(e)
            if unavailable is None:
                raise
            raise unavailable from e

    def _outage(self, e: psycopg.Error) -> DatabaseUnavailable | None:
        """``e`` as the port's DatabaseUnavailable if it says the server is gone (and a check of
        the idle connections started); None for anything else, a lost race included."""
        if _lost_race(e) or not _is_outage(e):
            return None
        self._check_idle()
        return _unavailable(e)

    def _check_idle(self) -> None:
        """One dead connection means the server went away, and a restart killed the idle ones
        too: test those now (the pool drops the dead and reconnects in the background) rather
        than hand each to a later request that then fails. In its own thread: the workers may
        all be busy, and a check against a server still down waits for its connect timeout."""
        pool = self._pool
        if pool is None or self._checking:
            return
        self._checking = True

        def check() -> None:
            try:
                pool.check()
            except Exception:   # noqa: BLE001 - the pool is closing, or the server is still down
                pass
            finally:
                self._checking = False
        threading.Thread(target=check, name="pg-check", daemon=True).start()

    async def _slot(self, first: bool = False) -> float:
        """A pooled connection is checked out only by a unit that holds one of ``pool_size``
        slots, taken here on the event loop: no worker thread ever waits for a connection, so a
        transaction that holds a connection (and maybe a row lock others wait for) always finds
        a thread for its next statement. The slot and the checkout together wait at most
        ``CHECKOUT_TIMEOUT`` (a 503 in time for Lark); returns what is left for the checkout.
        ``first``: ahead of the units already waiting (``write_first``)."""
        if self._slots is None:
            raise DatabaseError("database is not open")
        start = time.monotonic()
        try:
            # Not asyncio.wait_for: on 3.11 a cancel that lands as the slot is granted is
            # swallowed (the caller, e.g. a stopping scheduler, then ran on for 30 s).
            async with asyncio.timeout(CHECKOUT_TIMEOUT):
                await self._slots.acquire(first)
        except TimeoutError:
            raise DatabaseUnavailable(
                f"PostgreSQL is busy: no connection free within {CHECKOUT_TIMEOUT:g} s") from None
        return max(0.05, CHECKOUT_TIMEOUT - (time.monotonic() - start))

    async def _run_unit(self, fn: Callable[..., T], args: tuple, write: bool | None, first: bool = False) -> T:
        """A unit of work on the event loop (``_on_loop``): its function runs in a greenlet of
        the loop's thread, and each of its waits for the server is the loop waiting for the
        socket, as for any other — no worker thread, no hop there and back, no thread switch
        per round trip (bench/README.md §16). Without an idle connection at hand (the pool
        still growing, or a check of it running), it takes the worker path: the pool's
        checkout can block, and the loop must not."""
        slots = self._slots
        left = await self._slot(first)
        try:
            raw = self._idle_connection()
            if raw is None:
                return await self._hop(lambda: self._unit(fn, args, write, left))
            try:
                return await self._on_loop(raw, fn, args, write)
            finally:
                self._pool.putconn(raw)
        finally:
            slots.release()

    async def _on_loop(self, raw: psycopg.Connection, fn: Callable[..., T], args: tuple, write: bool | None) -> T:
        """``_unit`` on the loop: ``fn`` in a greenlet, whose waits (``_switch_to_loop``) come
        here as ``(socket, step)`` and are awaited, then it goes on. A lost race is rolled back
        and replayed, as in ``_unit``. Cancelled mid-way, the connection is closed first (the
        server rolls back; no unread result can reach the next user), then the greenlet is
        unwound."""
        raw._ethan_stats = self.stats   # type: ignore[attr-defined]
        attempt = 0
        while True:
            t0 = time.perf_counter()
            unit = greenlet.greenlet(lambda: self._once(raw, fn, args, write, on_loop=True))
            try:
                wait = unit.switch()
                while not unit.dead:
                    try:
                        await _ready(*wait)
                    except BaseException:
                        raw.close()
                        unit.throw(greenlet.GreenletExit)
                        raise
                    wait = unit.switch()
                return wait
            except psycopg.Error as e:
                if write is not False and _lost_race(e) and attempt < RETRIES:
                    attempt += 1
                    self.stats.add_retry(time.perf_counter() - t0)
                    await asyncio.sleep(_backoff(attempt))
                    continue
                unavailable = self._outage(e)
                if unavailable is None:
                    raise
                raise unavailable from e
            finally:
                self.stats.add_unit(time.perf_counter() - t0)

    async def _run_alone(self, statements: list[tuple[str, Sequence[Any]]]) -> list[Cursor]:
        """A one-statement unit (or independent statements in one pipeline: one implicit
        transaction, one round trip)."""
        return await self._run_unit(_pipelined, (statements,), None)

    def _idle_connection(self) -> psycopg.Connection | None:
        """A pooled connection that is free now, or None; never waits (on the event loop)."""
        pool = self._pool
        if pool is None:
            raise DatabaseError("database is not open")
        if pool.get_stats().get("pool_available", 0) <= 0:
            return None
        try:
            # Free a moment ago; a worker's unit (while the pool is still growing) or the idle
            # check may have taken it since: then wait no more than a blink of the loop.
            return pool.getconn(timeout=0.02)
        except psycopg_pool_timeout():
            return None

    def _unit(self, fn: Callable[..., T], args: tuple, write: bool | None,
              checkout: float = CHECKOUT_TIMEOUT) -> T:
        """``write``: True = a write transaction; False = a read snapshot; None = one statement
        (its own implicit transaction). A write that lost a race (deadlock, serialization
        failure) is rolled back and run again from the start, after a short random pause."""
        assert self._pool is not None
        attempt = 0
        while True:
            t0 = time.perf_counter()
            try:
                with self._pool.connection(timeout=checkout) as raw:
                    raw._ethan_stats = self.stats   # type: ignore[attr-defined]
                    return self._once(raw, fn, args, write)
            except psycopg.Error as e:
                if write is False or not _lost_race(e) or attempt >= RETRIES:
                    raise
                attempt += 1
                self.stats.add_retry(time.perf_counter() - t0)
                time.sleep(_backoff(attempt))
            finally:
                self.stats.add_unit(time.perf_counter() - t0)

    def _once(self, raw: psycopg.Connection, fn: Callable[..., T], args: tuple, write: bool | None,
              on_loop: bool = False) -> T:
        if write is None:
            conn = Connection(raw, on_loop=on_loop)
            try:
                return fn(conn, *args)
            finally:
                self.stats.add_round_trips(conn.round_trips)
        # BEGIN goes with the unit's first statement; a unit that ran none has begun nothing
        # and has nothing to commit.
        conn = Connection(raw, _BEGIN_WRITE if write else _BEGIN_READ, on_loop=on_loop)
        try:
            result = fn(conn, *args)
        except BaseException:
            if conn.begin is None and not conn.ended and not raw.closed:
                conn.round_trips += 1
                with contextlib.suppress(Exception):
                    conn.simple(b"ROLLBACK")
            raise
        else:
            if conn.begin is None and not conn.ended:
                conn.round_trips += 1
                conn.simple(b"COMMIT")
        finally:
            self.stats.add_round_trips(conn.round_trips)
        return result

    def _migrate(self) -> None:
        assert self._pool is not None
        with self._pool.connection() as raw:
            # a concurrent start's migration may take longer than the lock timeout: wait for it
            raw.execute(f"BEGIN; SET LOCAL lock_timeout = 0; SELECT pg_advisory_xact_lock({MIGRATE_LOCK})")
            raw.execute("CREATE TABLE IF NOT EXISTS schema_version"
                        " (version BIGINT NOT NULL, applied_at DOUBLE PRECISION NOT NULL)")
            current = raw.execute("SELECT MAX(version) FROM schema_version").fetchone()[0] or 0
            latest = len(PG_MIGRATIONS)
            if current > latest:
                raise SchemaTooNew(
                    f"database has schema version {current}, newer than this Ethan understands "
                    f"({latest}); upgrade Ethan or restore a backup")
            for version in range(current + 1, latest + 1):
                raw.execute(PG_MIGRATIONS[version - 1])
                raw.execute("INSERT INTO schema_version(version, applied_at) VALUES (%s, %s)",
                            (version, time.time()))
            raw.execute("COMMIT")   # releases the migration lock with the transaction

    def _tx_of_task(self) -> Connection | None:
        return self._tx.get(asyncio.current_task()) if self._tx else None

    # -- the port ------------------------------------------------------------------------
    async def read(self, fn: Callable[..., T], *args: Any) -> T:
        conn = self._tx_of_task()
        if conn is not None:
            return await self._hop(lambda: fn(conn, *args))
        return await self._run_unit(fn, args, False)

    async def write(self, fn: Callable[..., T], *args: Any) -> T:
        return await self._write(fn, args, False)

    async def write_first(self, fn: Callable[..., T], *args: Any) -> T:
        """``write``, served before the units already waiting for a connection."""
        return await self._write(fn, args, True)

    async def _write(self, fn: Callable[..., T], args: tuple, first: bool) -> T:
        conn = self._tx_of_task()
        if conn is not None:
            return await self._hop(lambda: fn(conn, *args))
        return await self._run_unit(fn, args, True, first)

    async def execute(self, sql: str, params: Sequence[Any] = ()) -> int:
        return (await self._write_alone(sql, params)).rowcount

    async def insert(self, sql: str, params: Sequence[Any] = ()) -> int:
        return int((await self._write_alone(sql, params)).lastrowid or 0)

    async def _write_alone(self, sql: str, params: Sequence[Any]) -> Cursor:
        """A one-statement write unit (its own implicit transaction, one round trip, prepared
        from its second use); inside ``transaction()``
        it joins that transaction."""
        conn = self._tx_of_task()
        if conn is not None:
            return await self._hop(lambda: conn.execute(sql, params))
        return (await self._run_alone([(sql, params)]))[0]

    async def executemany(self, sql: str, rows: Iterable[Sequence[Any]]) -> None:
        rows = list(rows)
        await self.write(lambda c: c.executemany(sql, rows))

    async def _statement(self, sql: str, params: Sequence[Any]) -> list:
        conn = self._tx_of_task()
        if conn is not None:
            return await self._hop(lambda: conn.execute(sql, params).fetchall())
        return (await self._run_alone([(sql, params)]))[0].fetchall()

    async def fetch_each(self, statements: Sequence[tuple[str, Sequence[Any]]], *,
                         write: bool = False) -> list[list]:
        """``port.Database.fetch_each``: one round trip (``Connection.pipelined``)."""
        statements = list(statements)
        conn = self._tx_of_task()
        if conn is not None:       # inside transaction(): its statements, one hop each
            return [await self._hop(lambda sql=sql, params=params: conn.execute(sql, params).fetchall())
                    for sql, params in statements]
        return [c.fetchall() for c in await self._run_alone(statements)]

    async def fetchone(self, sql: str, params: Sequence[Any] = ()):
        rows = await self._statement(sql, params)
        return rows[0] if rows else None

    async def fetchall(self, sql: str, params: Sequence[Any] = ()) -> list:
        return await self._statement(sql, params)

    @contextlib.asynccontextmanager
    async def transaction(self) -> AsyncIterator[AsyncTransaction]:
        """A write transaction holding one pooled connection across awaits. Its body cannot be
        replayed from here: a lost race (deadlock, serialization failure) is ``RetryLater``."""
        assert self._pool is not None
        if self._tx_of_task() is not None:
            raise DatabaseError("nested transaction")
        pool, slots = self._pool, self._slots
        left = await self._slot()
        try:
            async with self._transaction(pool, left) as tx:
                yield tx
        finally:
            slots.release()

    @contextlib.asynccontextmanager
    async def _transaction(self, pool: ConnectionPool, checkout: float) -> AsyncIterator[AsyncTransaction]:
        cm = pool.connection(timeout=checkout)
        raw = await self._hop(cm.__enter__)
        raw._ethan_stats = self.stats   # type: ignore[attr-defined]
        conn = Connection(raw)
        t0 = time.perf_counter()
        try:
            try:
                await self._hop(lambda: conn.simple(_BEGIN_WRITE))
                task = asyncio.current_task()
                self._tx[task] = conn
                try:
                    yield AsyncTransaction(self, conn)
                finally:
                    self._tx.pop(task, None)
            except BaseException:
                with contextlib.suppress(Exception):
                    await self._hop(lambda: conn.simple(b"ROLLBACK"))
                await self._hop(lambda: cm.__exit__(None, None, None))
                raise
            else:
                try:
                    await self._hop(lambda: conn.simple(b"COMMIT"))
                finally:
                    await self._hop(lambda: cm.__exit__(None, None, None))
        except psycopg.Error as e:
            if _lost_race(e):
                self.stats.add_retry(0.0)
                raise RetryLater(f"a concurrent write won ({e.sqlstate}); rolled back, retry") from e
            raise
        finally:
            self.stats.add_unit(time.perf_counter() - t0)
            self.stats.add_round_trips(conn.round_trips + 2)    # its BEGIN, its COMMIT or ROLLBACK

    async def schema_version(self) -> int:
        row = await self.fetchone("SELECT MAX(version) AS v FROM schema_version")
        return int(row["v"] or 0)

    async def integrity_check(self) -> str:
        await self.fetchone("SELECT 1")
        return "ok"

    async def table_columns(self) -> dict[str, list[tuple[str, str]]]:
        rows = await self.fetchall(
            "SELECT table_name, column_name, data_type FROM information_schema.columns"
            " WHERE table_schema = current_schema() ORDER BY table_name, ordinal_position")
        out: dict[str, list[tuple[str, str]]] = {}
        for r in rows:
            out.setdefault(r[0], []).append((r[1], r[2].upper()))
        return out

    async def ping(self) -> None:
        await self.fetchone("SELECT 1")

    async def backup_to(self, dest) -> None:
        """A server's backups are its own tools' (pg_dump, base backups with WAL archiving)."""
        raise NotSupported("ethan backup copies a SQLite file; for PostgreSQL use pg_dump "
                           "(docs/operations.md \"Backups\")")


def psycopg_pool_timeout():
    from psycopg_pool import PoolTimeout
    return PoolTimeout
