"""The SQLite engine of the storage port (storage/port.py): one file every memory layer shares.

WAL + synchronous=NORMAL (durable across process crashes, fast commits),
foreign keys, a busy timeout, BEGIN IMMEDIATE for every write transaction,
and versioned migrations recorded in ``schema_version``.

One ``Database`` owns one aiosqlite connection, which belongs to the event
loop that opened it. Writes are serialised by an asyncio lock so that two
coroutines never interleave statements inside one transaction; ``write_first``
(the inbox's commit, which an acknowledgement waits for) is served before the
writes already waiting (storage/queueing.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any, AsyncIterator, Callable, Iterable, Sequence, TypeVar

import aiosqlite

from storage._aiosqlite_compat import run_in_thread
from storage.port import DatabaseError, SchemaTooNew
from storage.queueing import PrioritySemaphore
from storage.schema import MIGRATIONS

BUSY_TIMEOUT_MS = 5000
T = TypeVar("T")
CHECKPOINT_INTERVAL_S = 0.5       # under full load ~0.5 s of commits is a few tens of MB of WAL
WAL_SIZE_LIMIT_BYTES = 32 * 1024 * 1024
BACKSTOP_CHECKPOINT_PAGES = 20_000   # ~80 MB of WAL before a commit checkpoints by itself


class SqliteDatabase:
    """The storage port (storage.port.Database) on SQLite (storage/postgres/database.py: PostgreSQL's).

    ``read(fn, *args)`` / ``write(fn, *args)`` run one unit of work ``fn(conn, *args)`` — a plain
    function over a DB-API connection — as one read snapshot / one serialised write transaction;
    ``fetchone``/``fetchall``/``execute``/``insert``/``executemany`` are one-statement units;
    ``transaction()`` is a multi-hop write transaction for code that awaits between statements."""
    dialect = "sqlite"

    def __init__(self, path: str | Path, *, busy_timeout_ms: int = BUSY_TIMEOUT_MS) -> None:
        self.path = str(path)
        self.busy_timeout_ms = busy_timeout_ms
        self._conn: aiosqlite.Connection | None = None
        self._write_lock = PrioritySemaphore(1)
        self._tx_owner: asyncio.Task | None = None
        self._checkpointer: threading.Thread | None = None
        self._checkpoint_stop = threading.Event()

    # -- lifecycle -----------------------------------------------------------------
    async def open(self) -> "SqliteDatabase":
        if self.path != ":memory:":
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        self._conn = await aiosqlite.connect(
            self.path, isolation_level=None, timeout=self.busy_timeout_ms / 1000
        )
        self._conn.row_factory = sqlite3.Row
        try:
            await self._conn.execute(f"PRAGMA busy_timeout={int(self.busy_timeout_ms)}")
            await self._enable_wal()
            await self._conn.execute("PRAGMA synchronous=NORMAL")
            await self._conn.execute("PRAGMA foreign_keys=ON")
            # Erased memory must not linger in free pages.
            await self._conn.execute("PRAGMA secure_delete=FAST")
            await self._migrate()
        except BaseException:
            # Never leave the connection (and its non-daemon thread) behind a failed open.
            with contextlib.suppress(Exception):
                await self._conn.close()
            self._conn = None
            raise
        return self

    async def _enable_wal(self) -> None:
        """Switching a new database to WAL can fail with SQLITE_BUSY without calling the busy
        handler (two processes creating it at once): retry until the busy timeout."""
        deadline = time.monotonic() + self.busy_timeout_ms / 1000
        while True:
            try:
                await self.conn.execute("PRAGMA journal_mode=WAL")
                return
            except sqlite3.OperationalError as e:
                if time.monotonic() >= deadline:
                    raise DatabaseError(f"database {self.path} is busy ({e}); another process holds it") from e
                await asyncio.sleep(0.02)

    # -- checkpoints off the hot path ---------------------------------------------------
    async def start_checkpointer(self, interval: float = CHECKPOINT_INTERVAL_S) -> None:
        """Copy the WAL into the database from a connection and thread of its own.

        SQLite's automatic checkpoint runs inside the commit that crosses 1,000 WAL pages, on
        the one thread every query of the bot waits for, and with fsyncs: a pause of ~100 ms
        every few thousand acknowledgements (bench_webhook_ack showed it as the p99). Passive
        checkpoints here never block a writer; the automatic one stays as a backstop at a
        higher mark in case this thread falls behind. The thread owns its connection from
        open to close, so nothing can close it under a running checkpoint."""
        if self._checkpointer is not None or self.path == ":memory:":
            return
        await self.conn.execute(f"PRAGMA wal_autocheckpoint={BACKSTOP_CHECKPOINT_PAGES}")
        # The WAL file keeps its high-water size unless told otherwise: back to this after a reset.
        await self.conn.execute(f"PRAGMA journal_size_limit={WAL_SIZE_LIMIT_BYTES}")
        self._checkpoint_stop = threading.Event()
        self._checkpointer = threading.Thread(
            target=_checkpoint_thread, args=(self.path, interval, self._checkpoint_stop),
            name="wal-checkpoint", daemon=True)
        self._checkpointer.start()

    async def close(self) -> None:
        if self._checkpointer is not None:
            self._checkpoint_stop.set()
            await asyncio.to_thread(self._checkpointer.join, 10)
            self._checkpointer = None
        if self._conn is not None:
            with contextlib.suppress(Exception):
                await self._conn.execute("PRAGMA optimize")
            await self._conn.close()
            self._conn = None

    @property
    def is_open(self) -> bool:
        return self._conn is not None

    @property
    def conn(self) -> aiosqlite.Connection:
        if self._conn is None:
            raise DatabaseError("database is not open")
        return self._conn

    # -- migrations ----------------------------------------------------------------
    async def _migrate(self) -> None:
        conn = self.conn
        await conn.execute(
            "CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL, applied_at REAL NOT NULL)"
        )
        cur = await conn.execute("SELECT MAX(version) FROM schema_version")
        row = await cur.fetchone()
        current = row[0] or 0
        latest = len(MIGRATIONS)
        if current > latest:
            raise SchemaTooNew(
                f"database {self.path} has schema version {current}, newer than this Ethan "
                f"understands ({latest}); upgrade Ethan or restore a backup"
            )
        for version in range(current + 1, latest + 1):
            script = MIGRATIONS[version - 1]
            async with self.transaction() as tx:
                # Another process may have migrated while we waited for the write lock.
                cur = await tx.execute("SELECT MAX(version) FROM schema_version")
                done = (await cur.fetchone())[0] or 0
                await cur.close()
                if done >= version:
                    continue
                for stmt in _split_sql(script):
                    await tx.execute(stmt)
                await tx.execute(
                    "INSERT INTO schema_version(version, applied_at) VALUES (?, ?)",
                    (version, time.time()),
                )

    async def schema_version(self) -> int:
        row = await self.fetchone("SELECT MAX(version) AS v FROM schema_version")
        return int(row["v"] or 0)

    # -- access --------------------------------------------------------------------
    @contextlib.asynccontextmanager
    async def transaction(self) -> AsyncIterator[aiosqlite.Connection]:
        """A write transaction: BEGIN IMMEDIATE ... COMMIT, rolled back on error."""
        async with self._write_lock.hold():
            conn = self.conn
            # Owned before BEGIN is queued: a read from another task queued after it waits
            # for the transaction to end (``_read``).
            self._tx_owner = asyncio.current_task()
            try:
                await conn.execute("BEGIN IMMEDIATE")
            except sqlite3.OperationalError as e:
                self._tx_owner = None
                raise DatabaseError(f"database is busy ({e}); another process holds the write lock") from e
            try:
                yield conn
            except BaseException:
                with contextlib.suppress(Exception):
                    await conn.execute("ROLLBACK")
                raise
            else:
                await conn.execute("COMMIT")
            finally:
                self._tx_owner = None

    @contextlib.asynccontextmanager
    async def _read(self) -> AsyncIterator[None]:
        """Reads share the writer's connection; while a ``transaction()`` (a write across awaits)
        is open, reads of other tasks wait for it to end, so nobody sees another coroutine's
        uncommitted rows. A one-hop ``write`` needs no wait: it runs whole in the connection's
        thread, and a read queued behind it runs after its COMMIT."""
        if self._tx_owner is not None and asyncio.current_task() is not self._tx_owner:
            async with self._write_lock.hold():
                yield
        else:
            yield

    async def execute(self, sql: str, params: Sequence[Any] = ()) -> int:
        """One write statement in its own transaction; returns the number of rows changed."""
        return await self.write(_rowcount, sql, params)

    async def insert(self, sql: str, params: Sequence[Any] = ()) -> int:
        """One INSERT in its own transaction; returns the new row's id."""
        return await self.write(_lastrowid, sql, params)

    async def executemany(self, sql: str, rows: Iterable[Sequence[Any]]) -> None:
        await self.write(_many, sql, list(rows))

    async def fetchone(self, sql: str, params: Sequence[Any] = ()) -> sqlite3.Row | None:
        async with self._read():
            # One round trip to the SQLite thread instead of execute/fetch/close.
            rows = await self.conn.execute_fetchall(sql, params)
            return rows[0] if rows else None

    async def fetchall(self, sql: str, params: Sequence[Any] = ()) -> list[sqlite3.Row]:
        async with self._read():
            return list(await self.conn.execute_fetchall(sql, params))

    async def fetch_each(self, statements: Sequence[tuple[str, Sequence[Any]]], *,
                         write: bool = False) -> list[list[sqlite3.Row]]:
        """``port.Database.fetch_each``: one hop to the SQLite thread (a write unit if ``write``)."""
        statements = list(statements)
        if write:
            return await self.write(_each, statements)
        return await self.read(_each, statements)

    # -- one round trip for a whole unit of work ------------------------------------
    # Every await on the connection is a hop to the SQLite thread and back (~0.1 ms of event
    # loop time under load, and a place in a FIFO shared with every other conversation). Hot
    # paths therefore run their statements as one plain function in that thread: ``read`` for
    # several SELECTs, ``write`` for a whole BEGIN IMMEDIATE ... COMMIT. The function gets the
    # sqlite3 connection and must not touch anything of the event loop.
    async def read(self, fn: Callable[..., T], *args: Any) -> T:
        """Run ``fn(conn, *args)`` in the SQLite thread; sees only committed rows of other tasks."""
        async with self._read():
            return await run_in_thread(self.conn, fn, *args)

    async def write(self, fn: Callable[..., T], *args: Any) -> T:
        """Run ``fn(conn, *args)`` as one write transaction in the SQLite thread (rolled back if
        it raises). Inside ``transaction()`` of the same task it joins that transaction."""
        return await self._write(fn, args, False)

    async def write_first(self, fn: Callable[..., T], *args: Any) -> T:
        """``write``, served before the writes already waiting for the writer."""
        return await self._write(fn, args, True)

    async def _write(self, fn: Callable[..., T], args: tuple, first: bool) -> T:
        if self._tx_owner is not None and asyncio.current_task() is self._tx_owner:
            return await run_in_thread(self.conn, fn, *args)
        async with self._write_lock.hold(first):
            return await run_in_thread(self.conn, _in_transaction, fn, args)

    async def backup_to(self, dest: str | Path) -> None:
        """A consistent copy while the server runs (SQLite online backup API)."""
        Path(dest).parent.mkdir(parents=True, exist_ok=True)
        target = sqlite3.connect(str(dest))
        try:
            await self.conn.backup(target)
        finally:
            target.close()

    async def ping(self) -> None:
        await self.fetchone("SELECT 1")

    async def integrity_check(self) -> str:
        row = await self.fetchone("PRAGMA integrity_check")
        return str(row[0])

    async def table_columns(self) -> dict[str, list[tuple[str, str]]]:
        """Every ordinary table (search index internals aside) and its (column, TYPE) pairs."""
        out: dict[str, list[tuple[str, str]]] = {}
        for t in await self.fetchall(
                "SELECT name FROM sqlite_master WHERE type = 'table' AND sql NOT LIKE 'CREATE VIRTUAL%'"
                " AND name NOT LIKE 'sqlite_%' AND name NOT LIKE '%_fts_%' ORDER BY name"):
            cols = await self.fetchall(f'PRAGMA table_info("{t["name"]}")')
            out[t["name"]] = [(c["name"], (c["type"] or "").upper()) for c in cols]
        return out


def check_file(path: str | Path) -> str:
    """SQLite's integrity check of a database file nobody has open (a backup before it is kept):
    ``"ok"`` or the first problem found."""
    conn = sqlite3.connect(str(path))
    try:
        return str(conn.execute("PRAGMA integrity_check").fetchone()[0])
    finally:
        conn.close()


def _checkpoint_thread(path: str, interval: float, stop: threading.Event) -> None:
    conn = sqlite3.connect(path)
    try:
        conn.execute(f"PRAGMA journal_size_limit={WAL_SIZE_LIMIT_BYTES}")
        while not stop.wait(interval):
            with contextlib.suppress(sqlite3.Error):   # busy or locked: the next round does it
                conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
    finally:
        conn.close()


def _rowcount(conn: sqlite3.Connection, sql: str, params: Sequence[Any]) -> int:
    return conn.execute(sql, params).rowcount


def _lastrowid(conn: sqlite3.Connection, sql: str, params: Sequence[Any]) -> int:
    return int(conn.execute(sql, params).lastrowid or 0)


def _each(conn: sqlite3.Connection, statements: list) -> list[list[sqlite3.Row]]:
    return [conn.execute(sql, params).fetchall() for sql, params in statements]


def _many(conn: sqlite3.Connection, sql: str, rows: list) -> None:
    conn.executemany(sql, rows)


def _in_transaction(conn: sqlite3.Connection, fn: Callable[..., T], args: tuple) -> T:
    try:
        conn.execute("BEGIN IMMEDIATE")
    except sqlite3.OperationalError as e:
        raise DatabaseError(f"database is busy ({e}); another process holds the write lock") from e
    try:
        result = fn(conn, *args)
    except BaseException:
        with contextlib.suppress(Exception):
            conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")
    return result


def _split_sql(script: str) -> list[str]:
    """Split a migration into statements; triggers keep their inner semicolons."""
    out: list[str] = []
    buf: list[str] = []
    for line in script.splitlines():
        buf.append(line)
        candidate = "\n".join(buf).strip()
        if candidate.endswith(";") and sqlite3.complete_statement(candidate):
            out.append(candidate)
            buf = []
    tail = "\n".join(buf).strip()
    if tail:
        out.append(tail)
    return out
