"""The storage port: what every store is written against, declared once.

Two engines implement it — ``storage.sqlite.SqliteDatabase`` (one file, one writer) and
``storage.postgres.PgDatabase`` (a server, many replicas) — and nothing outside this package
knows which one it holds except through ``dialect`` (the few statements the engines spell too
differently to translate branch on it). The drivers (aiosqlite, psycopg) are imported only
inside this package; the errors a store or the delivery layer catches are defined here, so
catching them never imports a driver.

A unit of work is a plain function ``fn(conn, *args)`` over a DB-API connection: ``read`` runs
it in one snapshot, ``write`` as one write transaction. ``transaction()`` is a write
transaction for code that awaits between statements.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any, AsyncContextManager, Callable, Iterable, Protocol, Sequence, TypeVar, runtime_checkable

T = TypeVar("T")


class DatabaseError(RuntimeError):
    """A database problem worth one clear line to an operator."""


class SchemaTooNew(DatabaseError):
    pass


class DatabaseUnavailable(DatabaseError):
    """The database server cannot be reached (PostgreSQL down or restarting): the webhook
    answers 503 so Lark retries, and /healthz is not ready."""


class NotSupported(DatabaseError):
    """An operation this engine does not offer (``backup_to`` on PostgreSQL: use pg_dump)."""


class RetryLater(DatabaseError):
    """A write lost a race it cannot replay by itself (a PostgreSQL serialization failure or
    deadlock inside an awaited ``transaction()``): rolled back, nothing half-done — the caller
    retries the whole step, as it retries a database outage."""


class IntegrityError(sqlite3.IntegrityError):
    """A uniqueness or foreign-key violation on either backend. A subclass of sqlite3's so one
    ``except sqlite3.IntegrityError`` in a store catches both engines' violations."""


def is_database_error(e: BaseException | None) -> bool:
    """A failure of the database itself (locked, full, I/O, server gone), not a bug: worth a
    retry, and a 503 rather than a 500 (the cause chain is followed a few links)."""
    seen = 0
    while e is not None and seen < 5:
        if isinstance(e, (sqlite3.Error, DatabaseError)):
            return True
        # PostgreSQL's driver errors, also when a store raised one past storage/postgres/wire.py's
        # translation (matched by module: psycopg is imported only when it is configured)
        if type(e).__module__.split(".")[0] in ("psycopg", "psycopg_pool"):
            return True
        e, seen = e.__cause__ or e.__context__, seen + 1
    return False


def dialect_of(conn: Any) -> str:
    """``"sqlite"`` or ``"postgres"``: what a unit-of-work function (or a transaction) was
    given. The few statements the engines spell too differently to translate branch on it."""
    return getattr(conn, "dialect", "sqlite")


def is_database_url(value: str | Path) -> bool:
    return str(value).startswith(("postgresql://", "postgres://"))


# -- concurrency: what a unit asks for beyond its own statements (docs/internals.md
# "Concurrency, per store"). SQLite has one writer, so both are no-ops there; PostgreSQL runs
# write units concurrently, each READ COMMITTED.

def _lock_key(kind: str, key: Any) -> str:
    return f"{kind}:{key}"


def serialize(conn: Any, kind: str, key: Any) -> None:
    """Inside a write unit: wait for, then hold until the unit commits, the lock of one
    ``kind``/``key`` (``"user"``/an open_id, ``"conversation"``/a conv_key, ``"session"``/an id).
    For a unit that reads a whole set (a user's facts, a conversation's sessions) and decides
    from it: another unit about the same key waits, units about other keys do not. Take it
    first in the unit, and at most one per unit unless the keys are taken in a fixed order."""
    if dialect_of(conn) == "postgres":      # (sqlite3.Connection.serialize is something else)
        conn.serialize(_lock_key(kind, key))


async def serialize_tx(tx: Any, kind: str, key: Any) -> None:
    """``serialize`` inside an awaited ``Database.transaction()``."""
    if dialect_of(tx) == "postgres":
        await tx.serialize(_lock_key(kind, key))


def execute_last(conn: Any, sql: str, params: Sequence[Any] = ()) -> Any:
    """The last statement of a unit of work: ``conn.execute``, and on PostgreSQL the unit's
    transaction ends with it, in its round trip (a unit of this one statement sends no BEGIN;
    after others, the COMMIT goes in the same pipeline) — one round trip fewer per unit.
    Nothing may run on ``conn`` after it (on PostgreSQL that raises: it would run outside the
    unit), and what ``fn`` does after it cannot undo it. Inside an awaited ``transaction()`` it is a plain statement of that transaction."""
    if dialect_of(conn) == "postgres":
        return conn.execute_last(sql, params)
    return conn.execute(sql, params)


def for_update(conn: Any) -> str:
    """`` FOR UPDATE`` on PostgreSQL, nothing on SQLite: appended to a SELECT of rows the unit
    then changes, so a concurrent unit changing them waits instead of being overwritten."""
    return " FOR UPDATE" if dialect_of(conn) == "postgres" else ""


@runtime_checkable
class Connection(Protocol):
    """What a unit of work ``fn(conn, *args)`` gets from ``read`` / ``write``: a DB-API connection
    taking SQLite's dialect — ``sqlite3.Connection`` itself, or storage/postgres/wire.py's, which
    translates — whose ``execute`` returns a cursor (``fetchone``, ``fetchall``)."""

    def execute(self, sql: str, params: Sequence[Any] = ...) -> Any: ...

    def executemany(self, sql: str, rows: Iterable[Sequence[Any]]) -> Any: ...


@runtime_checkable
class Transaction(Protocol):
    """What ``Database.transaction()`` yields: aiosqlite's connection shape."""

    async def execute(self, sql: str, params: Sequence[Any] = ...) -> Any: ...

    async def execute_fetchall(self, sql: str, params: Sequence[Any] = ...) -> Iterable[Any]: ...

    async def executemany(self, sql: str, rows: Iterable[Sequence[Any]]) -> None: ...


@runtime_checkable
class Database(Protocol):
    """The storage port. Rows read by name and by index (``row["id"]``, ``row[0]``, ``dict(row)``)."""

    dialect: str      # "sqlite" | "postgres"
    path: str         # the SQLite file, or the PostgreSQL URL

    # -- lifecycle
    async def open(self) -> "Database":
        """Connect and migrate to the latest schema (SchemaTooNew if the database is newer)."""

    async def close(self) -> None: ...

    @property
    def is_open(self) -> bool: ...

    async def start_checkpointer(self, interval: float = ...) -> None:
        """SQLite: WAL checkpoints off the hot path; PostgreSQL: nothing (the server does it)."""

    async def ping(self) -> None:
        """One round trip; raises DatabaseUnavailable (or another DatabaseError) if it fails."""

    # -- units of work
    async def read(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(conn, *args)`` in one snapshot of committed rows."""

    async def write(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(conn, *args)`` as one write transaction (rolled back if it raises). SQLite: one
        writer at a time. PostgreSQL: concurrent; a serialization failure or deadlock reruns
        ``fn`` from the start, so ``fn`` must do nothing but its statements. Inside
        ``transaction()`` of the same task it joins that transaction."""

    async def write_first(self, fn: Callable[..., T], *args: Any) -> T:
        """``write``, served before the units already waiting for the database (SQLite's
        writer, PostgreSQL's connections): for the inbox's commit, which an acknowledgement
        to Lark waits for (storage/queueing.py)."""

    def transaction(self) -> AsyncContextManager[Transaction]:
        """A write transaction across awaits; on PostgreSQL a lost race raises RetryLater."""

    async def execute(self, sql: str, params: Sequence[Any] = ...) -> int:
        """One write statement; the number of rows changed."""

    async def insert(self, sql: str, params: Sequence[Any] = ...) -> int:
        """One INSERT; the new row's id."""

    async def executemany(self, sql: str, rows: Iterable[Sequence[Any]]) -> None: ...

    async def fetchone(self, sql: str, params: Sequence[Any] = ...) -> Any | None: ...

    async def fetchall(self, sql: str, params: Sequence[Any] = ...) -> list[Any]: ...

    async def fetch_each(self, statements: Sequence[tuple[str, Sequence[Any]]], *,
                         write: bool = False) -> list[list[Any]]:
        """Independent statements (``write``: some change rows) sent together, each one's rows
        in order: for the reads one message makes of several stores. PostgreSQL: one round trip
        (libpq's pipeline), one implicit transaction; SQLite: one unit in its thread (a write
        unit if ``write``). Not a snapshot to rely on across them."""

    # -- administration
    async def schema_version(self) -> int: ...

    async def integrity_check(self) -> str:
        """``"ok"`` or the first problem found."""

    async def table_columns(self) -> dict[str, list[tuple[str, str]]]:
        """Every ordinary table and its (column, TYPE) pairs (``ethan db copy``'s map)."""

    async def backup_to(self, dest: str | Path) -> None:
        """SQLite: a consistent copy while the server runs. PostgreSQL: NotSupported — its
        backups are pg_dump's (one line saying so, never an AttributeError)."""


async def fetch_one(conn: Transaction, sql: str, params: Sequence[Any] = ()) -> Any | None:
    """One row, on the connection ``Database.transaction()`` yields (one round trip)."""
    rows = await conn.execute_fetchall(sql, params)
    rows = list(rows)
    return rows[0] if rows else None


async def fetch_all(conn: Transaction, sql: str, params: Sequence[Any] = ()) -> list[Any]:
    """Every row, on the connection ``Database.transaction()`` yields (one round trip)."""
    return list(await conn.execute_fetchall(sql, params))
