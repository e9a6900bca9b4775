"""The storage engine: the declared port (``storage.port``) and its two engines.

``database(target)`` gives the engine for a target — a PostgreSQL URL or a SQLite file path —
not yet opened. Importing this package imports no driver: psycopg only when a PostgreSQL URL is
opened, aiosqlite only with the SQLite engine.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from storage.port import (Connection, Database, DatabaseError, DatabaseUnavailable, IntegrityError,
                          NotSupported, RetryLater, SchemaTooNew, Transaction, dialect_of, execute_last,
                          fetch_all, fetch_one, for_update, is_database_error, is_database_url, serialize, serialize_tx)

__all__ = ["Connection", "Database", "DatabaseError", "DatabaseUnavailable", "IntegrityError", "NotSupported",
           "RetryLater", "SchemaTooNew", "Transaction", "database", "dialect_of", "execute_last", "fetch_all",
           "fetch_one", "for_update", "is_database_error", "is_database_url", "serialize", "serialize_tx"]


def database(target: str | Path, **kwargs: Any) -> Database:
    """The Database for ``target``: a PostgreSQL URL or a SQLite file path (not yet opened)."""
    if is_database_url(target):
        from storage.postgres import PgDatabase   # psycopg only when PostgreSQL is configured
        return PgDatabase(str(target), **kwargs)
    from storage.sqlite import SqliteDatabase
    return SqliteDatabase(target, **kwargs)
