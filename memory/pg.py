"""The PostgreSQL backend of the one Database port (memory/db.py).

Why psycopg 3 with sync connections in a worker pool (and not asyncpg): every store's unit of
work is one plain function over a DB-API connection (``fn(conn, *args)``), run today in
SQLite's own thread. psycopg's sync connection is a DB-API connection, so the very same
functions run here, one pooled connection and one worker thread per unit of work, with no
second async implementation of each store. asyncpg would need every unit rewritten as
coroutines (and its own placeholder style); the measured cost of our way is in bench/README.md.

The SQL the stores write is SQLite's dialect; ``translate`` rewrites the few spellings that
differ (placeholders, ``INSERT OR IGNORE``, ``instr``, negative ``substr``, ``LIKE``'s case
rule, ids of inserted rows) once per distinct statement. What cannot be rewritten mechanically
(search) asks ``conn.dialect`` and has a branch per engine in its store.

Guarantees: a write unit is one transaction that first takes a transaction-scoped advisory
lock (``WRITE_LOCK``), so writers are serialised across every replica exactly as SQLite's
``BEGIN IMMEDIATE`` serialises them across processes; read units run concurrently, each in
one REPEATABLE READ snapshot (SQLite's read transaction).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import re
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from decimal import Decimal
from typing import Any, AsyncIterator, Callable, Iterable, Sequence, TypeVar

import psycopg
from psycopg.adapt import Dumper, Loader
from psycopg.pq import Format
from psycopg_pool import ConnectionPool

from memory.db import DatabaseError, DatabaseUnavailable, IntegrityError, SchemaTooNew
from memory.schema.postgres import PG_MIGRATIONS

T = TypeVar("T")
WRITE_LOCK = 0x45746861      # "Etha": the advisory lock every write transaction holds
MIGRATE_LOCK = 0x45746862    # concurrent `ethan serve` starts migrate one at a time
DEFAULT_POOL = 8
# Connections are in autocommit mode and transactions are begun by hand, so that BEGIN and the
# write lock go in one round trip (psycopg's implicit BEGIN would be a round trip of its own),
# and a one-statement read is one round trip with no transaction around it.
_BEGIN_WRITE = f"BEGIN; SELECT pg_advisory_xact_lock({WRITE_LOCK})"
_BEGIN_READ = "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY"


# -- rows: sqlite3.Row's shape (by index and by name, dict(row)) ---------------------------
class Row(tuple):
    def __new__(cls, values: Iterable[Any], index: dict[str, int]) -> "Row":
        row = tuple.__new__(cls, values)
        row._index = index
        return row

    def __getitem__(self, key):  # type: ignore[override]
        if isinstance(key, str):
            try:
                return tuple.__getitem__(self, self._index[key])
            except KeyError:
                return tuple.__getitem__(self, self._index[key.lower()])
        return tuple.__getitem__(self, key)

    def keys(self) -> list[str]:
        return list(self._index)


def _row_factory(cursor):
    names = [c.name for c in cursor.description or ()]
    index = {n: i for i, n in enumerate(names)}
    return lambda values: Row(values, index)


class _NumericLoader(Loader):
    """SUM/AVG give numeric in PostgreSQL; SQLite gives int or float, and so do we."""

    def load(self, data):
        d = Decimal(bytes(data).decode())
        return int(d) if d == d.to_integral_value() else float(d)


class _BoolAsInt(Dumper):
    """Flags are INTEGER 0/1 columns on both engines; Python True goes in as 1."""
    oid = psycopg.adapters.types["int8"].oid
    format = Format.TEXT

    def dump(self, obj):
        return b"1" if obj else b"0"


# -- the dialect ---------------------------------------------------------------------------
_INSERT_IGNORE = re.compile(r"^\s*INSERT\s+OR\s+IGNORE\s+INTO", re.I)
_NEG_SUBSTR = re.compile(r"substr\(([^,()]+),\s*-(\d+)\)", re.I)
_INSTR = re.compile(r"\binstr\(", re.I)
_LIKE = re.compile(r"\bLIKE\b")
_INSERT_TABLE = re.compile(r"^\s*INSERT\s+INTO\s+(\w+)", re.I)
_AS_REAL = re.compile(r"\bAS\s+REAL\b", re.I)
_IFNULL = re.compile(r"\bIFNULL\(", re.I)
_UNARY_PLUS = re.compile(r"(?<=[\s(])\+(?=[A-Za-z_])")        # SQLite's "don't use this index"
_WHERE_CONST = re.compile(r"\b(WHERE|AND|OR)\s+([01])(?=\s*(?:$|\)|ORDER|GROUP|LIMIT|AND|OR))", re.I)
_JSON_EACH = re.compile(r"([\w.]+)\s+IN\s+\(SELECT value FROM json_each\(\?\)\)", re.I)
_SCALAR_MINMAX = re.compile(r"\b(max|min)\(", re.I)


def _scalar_minmax(sql: str) -> str:
    """SQLite's two-argument max()/min() are PostgreSQL's GREATEST()/LEAST()."""
    out, pos = [], 0
    for m in _SCALAR_MINMAX.finditer(sql):
        depth, i, comma = 1, m.end(), False
        while i < len(sql) and depth:
            c = sql[i]
            if c == "(":
                depth += 1
            elif c == ")":
                depth -= 1
            elif c == "," and depth == 1:
                comma = True
            i += 1
        if comma:
            out.append(sql[pos:m.start()])
            out.append("GREATEST(" if m.group(1).lower() == "max" else "LEAST(")
            pos = m.end()
    out.append(sql[pos:])
    return "".join(out)

# Tables whose ``id`` is an identity column: an INSERT into one returns its id (lastrowid).
IDENTITY_TABLES = frozenset(re.findall(r"CREATE TABLE (\w+) \(\s*id\s+BIGINT GENERATED", "\n".join(PG_MIGRATIONS)))


def _placeholders(sql: str) -> str:
    """``?`` -> ``%s`` outside string literals; a literal ``%`` -> ``%%``."""
    out: list[str] = []
    quote = ""
    for ch in sql:
        if quote:
            if ch == quote:
                quote = ""
        elif ch in ("'", '"'):
            quote = ch
        elif ch == "?":
            out.append("%s")
            continue
        out.append("%%" if ch == "%" else ch)
    return "".join(out)


@functools.lru_cache(maxsize=2048)
def translate(sql: str) -> tuple[str, bool]:
    """SQLite-dialect SQL -> (PostgreSQL SQL, whether it returns the inserted id)."""
    returns_id = False
    if _INSERT_IGNORE.match(sql):
        sql = _INSERT_IGNORE.sub("INSERT INTO", sql, count=1) + " ON CONFLICT DO NOTHING"
    sql = _NEG_SUBSTR.sub(r"right(\1, \2)", sql)
    sql = _INSTR.sub("strpos(", sql)
    sql = _LIKE.sub("ILIKE", sql)
    sql = _AS_REAL.sub("AS DOUBLE PRECISION", sql)
    sql = _IFNULL.sub("COALESCE(", sql)
    sql = _UNARY_PLUS.sub("", sql)
    sql = _WHERE_CONST.sub(lambda m: f"{m.group(1)} {'TRUE' if m.group(2) == '1' else 'FALSE'}", sql)
    # ids in a JSON array parameter (one parameter however many ids): compared as text
    sql = _JSON_EACH.sub(r"(\1)::text IN (SELECT value FROM json_array_elements_text(?::json))", sql)
    sql = _scalar_minmax(sql)
    m = _INSERT_TABLE.match(sql)
    if m and m.group(1).lower() in IDENTITY_TABLES and "RETURNING" not in sql.upper():
        sql = sql.rstrip().rstrip(";") + " RETURNING id"
        returns_id = True
    return _placeholders(sql), returns_id


class Cursor:
    """The part of sqlite3.Cursor the stores use."""

    def __init__(self, cur: psycopg.Cursor, returns_id: bool) -> None:
        self._cur = cur
        self.lastrowid: int | None = None
        if returns_id:
            row = cur.fetchone() if cur.description else None
            self.lastrowid = int(row[0]) if row else None
        self.rowcount = cur.rowcount

    def fetchone(self):
        return self._cur.fetchone() if self._cur.description else None

    def fetchall(self) -> list:
        return self._cur.fetchall() if self._cur.description else []

    def __iter__(self):
        return iter(self.fetchall())

    def close(self) -> None:
        self._cur.close()


class Connection:
    """A sqlite3.Connection look-alike over one psycopg connection: what every unit-of-work
    function of the stores is given on this backend."""
    dialect = "postgres"

    def __init__(self, raw: psycopg.Connection) -> None:
        self.raw = raw

    def execute(self, sql: str, params: Sequence[Any] = ()) -> Cursor:
        q, returns_id = translate(sql)
        cur = self.raw.cursor()
        try:
            cur.execute(q, list(params))
        except psycopg.errors.IntegrityError as e:
            raise IntegrityError(str(e)) from e
        return Cursor(cur, returns_id)

    def executemany(self, sql: str, rows: Iterable[Sequence[Any]]) -> None:
        q, _ = translate(sql)
        if q.endswith(" RETURNING id") and _:
            q = q[: -len(" RETURNING id")]
        try:
            with self.raw.cursor() as cur:
                cur.executemany(q, [list(r) for r in rows])
        except psycopg.errors.IntegrityError as e:
            raise IntegrityError(str(e)) from e


def _configure(raw: psycopg.Connection) -> None:
    raw.adapters.register_loader("numeric", _NumericLoader)
    raw.adapters.register_dumper(bool, _BoolAsInt)


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


# SQLSTATEs of a server that is going away or not yet back (admin/crash shutdown, "cannot
# connect now" while it starts or recovers, too many connections) and class 08 (connection).
_OUTAGE_STATES = frozenset({"57P01", "57P02", "57P03", "53300"})


def _is_outage(e: BaseException) -> bool:
    """A lost or refused connection, whatever psycopg calls it: ``OperationalError`` (server
    closed the connection, AdminShutdown), ``InterfaceError`` (a connection already closed),
    the pool's timeout — and any error whose SQLSTATE says the server is shutting down or
    starting. Such an error is DatabaseUnavailable (webhook 503, handler retry), not a bug."""
    if isinstance(e, (psycopg.OperationalError, psycopg.InterfaceError)):   # PoolTimeout too
        return True
    state = getattr(e, "sqlstate", None) or ""
    return isinstance(e, psycopg.Error) and (state.startswith("08") or state in _OUTAGE_STATES)


def _unavailable(e: BaseException) -> DatabaseUnavailable:
    text = str(e).strip()
    return DatabaseUnavailable(f"PostgreSQL is unreachable ({text.splitlines()[0] if text else type(e).__name__})")


class PgDatabase:
    """The Database port on PostgreSQL (see memory/db.py for the contract)."""
    dialect = "postgres"

    def __init__(self, url: str, *, pool_size: int = DEFAULT_POOL, connect_timeout: float = 5.0) -> None:
        self.url = url
        self.path = url
        self.pool_size = pool_size
        self.connect_timeout = connect_timeout
        self._pool: ConnectionPool | None = None
        self._executor: ThreadPoolExecutor | None = None
        self._tx: dict[asyncio.Task, Connection] = {}   # each open transaction() by its task
        self._checking = False                          # a check of idle connections is running

    async def open(self) -> "PgDatabase":
        self._executor = ThreadPoolExecutor(self.pool_size, thread_name_prefix="pg")
        self._pool = ConnectionPool(
            self.url, min_size=1, max_size=self.pool_size, open=False, configure=_configure,
            kwargs={"row_factory": _row_factory, "autocommit": True,
                    "connect_timeout": max(1, int(self.connect_timeout))},
            timeout=self.connect_timeout, name="ethan")
        try:
            await self._hop(lambda: self._pool.open(wait=True, timeout=self.connect_timeout))
            await self._hop(self._migrate)
        except BaseException as e:
            await self.close()
            if isinstance(e, (psycopg.OperationalError, psycopg_pool_timeout())):
                raise _unavailable(e) from e
            raise
        return self

    async def close(self) -> None:
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
            if not _is_outage(e):
                raise
            self._check_idle()
            raise _unavailable(e) from e

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

    def _unit(self, fn: Callable[..., T], args: tuple, write: bool | None) -> T:
        """``write``: True = a write transaction; False = a read snapshot; None = one statement
        (its own snapshot already, no transaction needed)."""
        assert self._pool is not None
        with self._pool.connection() as raw:
            conn = Connection(raw)
            if write is None:
                return fn(conn, *args)
            raw.execute(_BEGIN_WRITE if write else _BEGIN_READ)
            try:
                result = fn(conn, *args)
            except BaseException:
                with contextlib.suppress(Exception):
                    raw.execute("ROLLBACK")
                raise
            raw.execute("COMMIT")
            return result

    def _migrate(self) -> None:
        assert self._pool is not None
        with self._pool.connection() as raw:
            raw.execute(f"BEGIN; SELECT pg_advisory_xact_lock({MIGRATE_LOCK})")
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
        return await self._hop(lambda: self._unit(fn, args, write=False))

    async def write(self, fn: Callable[..., T], *args: Any) -> T:
        conn = self._tx_of_task()
        if conn is not None:
            return await self._hop(lambda: fn(conn, *args))
        return await self._hop(lambda: self._unit(fn, args, write=True))

    async def execute(self, sql: str, params: Sequence[Any] = ()) -> int:
        return await self.write(lambda c: c.execute(sql, params).rowcount)

    async def insert(self, sql: str, params: Sequence[Any] = ()) -> int:
        return await self.write(lambda c: int(c.execute(sql, params).lastrowid or 0))

    async def executemany(self, sql: str, rows: Iterable[Sequence[Any]]) -> None:
        rows = list(rows)
        await self.write(lambda c: c.executemany(sql, rows))

    async def _statement(self, sql: str, params: Sequence[Any]) -> list:
        conn = self._tx_of_task()
        if conn is not None:
            return await self._hop(lambda: conn.execute(sql, params).fetchall())
        return await self._hop(lambda: self._unit(lambda c: c.execute(sql, params).fetchall(), (), None))

    async def fetchone(self, sql: str, params: Sequence[Any] = ()):
        rows = await self._statement(sql, params)
        return rows[0] if rows else None

    async def fetchall(self, sql: str, params: Sequence[Any] = ()) -> list:
        return await self._statement(sql, params)

    @contextlib.asynccontextmanager
    async def transaction(self) -> AsyncIterator[AsyncTransaction]:
        """A write transaction holding one pooled connection and the write lock."""
        assert self._pool is not None
        if self._tx_of_task() is not None:
            raise DatabaseError("nested transaction")
        pool = self._pool
        cm = pool.connection()
        raw = await self._hop(cm.__enter__)
        conn = Connection(raw)
        try:
            await self._hop(lambda: raw.execute(_BEGIN_WRITE))
            task = asyncio.current_task()
            self._tx[task] = conn
            try:
                yield AsyncTransaction(self, conn)
            finally:
                self._tx.pop(task, None)
        except BaseException:
            with contextlib.suppress(Exception):
                await self._hop(lambda: raw.execute("ROLLBACK"))
            await self._hop(lambda: cm.__exit__(None, None, None))
            raise
        else:
            try:
                await self._hop(lambda: raw.execute("COMMIT"))
            finally:
                await self._hop(lambda: cm.__exit__(None, None, None))

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


def psycopg_pool_timeout():
    from psycopg_pool import PoolTimeout
    return PoolTimeout
