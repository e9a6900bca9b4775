"""Counting hops to the SQLite thread, for tests of "one round trip per unit of work"."""

from __future__ import annotations

import contextlib
from typing import Iterator


@contextlib.contextmanager
def counting_round_trips(db) -> Iterator[dict]:
    """``with counting_round_trips(db) as trips: …`` then ``trips["n"]``: calls made to aiosqlite's
    ``Connection._execute`` (each is one hop to the SQLite thread and back) inside the block."""
    trips = {"n": 0}
    real = db.conn._execute

    async def counting(fn, *args, **kwargs):
        trips["n"] += 1
        return await real(fn, *args, **kwargs)

    db.conn._execute = counting
    try:
        yield trips
    finally:
        db.conn._execute = real
