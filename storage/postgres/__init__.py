"""The PostgreSQL engine of the storage port: its public face is ``PgDatabase``."""

from storage.postgres.database import PgDatabase  # noqa: F401
