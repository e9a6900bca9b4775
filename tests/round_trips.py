"""Counting round trips to the database, for tests of "n round trips per unit of work".

On SQLite a round trip is a hop to the SQLite thread and back (aiosqlite's ``_execute``); on
PostgreSQL it is a message to the server and its answer (the engine's own count,
``PgDatabase.stats``: each statement, and each unit's BEGIN-less COMMIT or ROLLBACK)."""

from __future__ import annotations

import contextlib
from typing import Iterator


@contextlib.contextmanager
def counting_round_trips(db) -> Iterator[dict]:
    """``with counting_round_trips(db) as trips: …`` then ``trips["n"]``: round trips made inside
    the block."""
    trips = {"n": 0}
    if getattr(db, "dialect", "sqlite") == "postgres":
        before = db.stats.snapshot()["round_trips"]
        try:
            yield trips
        finally:
            trips["n"] = db.stats.snapshot()["round_trips"] - before
        return
    real = db.conn._execute

    async def counting(fn, *args, **kwargs):
        trips["n"] += 1
        return await real(fn, *args, **kwargs)

    db.conn._execute = counting
    try:
        yield trips
    finally:
        db.conn._execute = real
