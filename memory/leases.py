"""Leases: which replica works a row right now (DESIGN.md §7, docs/reliability.md "Replicas").

The one lease implementation of every store that shares work between replicas: inbox rows and
conversations (bot/delivery/inbox_store.py), consolidation jobs (memory/working/consolidation_queue.py),
and each replica's own liveness (its id held by one live process). A lease is an ``owner`` and
a ``lease_until`` its owner's heartbeat renews; anybody may take a lease that is free, its own,
or expired.

**Whose clock.** Every ``now`` a lease is written or compared with comes from a
:class:`DatabaseClock`: the database's time, measured at start and at each heartbeat, so
replicas on one database agree on when a lease ends whatever their own clocks say (issue 32
M6: a replica 40 s ahead saw every other replica's lease as expired and answered their
messages a second time).

A replica is named by ``ETHAN_REPLICA_ID`` (default ``<hostname>:<pid>``).
"""

from __future__ import annotations

import os
import socket
import time
from dataclasses import dataclass
from typing import Any, Callable

from storage import dialect_of


def default_replica_id() -> str:
    """``<hostname>:<pid>``: unique per process on a host, and a restarted process is a new
    replica (its predecessor's leases expire; nothing waits for a pid to come back)."""
    return f"{socket.gethostname()}:{os.getpid()}"


def free_sql(owner: str = "owner", until: str = "lease_until", *, own: bool = True) -> str:
    """The claim rule as a WHERE fragment over a row's lease columns: nobody's, ``own`` (the
    first ``?``: this owner), or expired (the next ``?``: now)."""
    mine = f" OR {owner} = ?" if own else ""
    return f"({owner} IS NULL{mine} OR {until} < ?)"


@dataclass(frozen=True)
class LeaseTable:
    """A table of leases keyed by one column: ``(key, owner, lease_until)`` rows."""
    table: str
    key: str

    def claim(self, conn: Any, key: str, owner: str, now: float, until: float, *, wait: bool = True) -> bool:
        """Free, ours, or expired -> ours until ``until``; False when a live owner holds it.

        ``wait`` (the default): one conditional upsert, atomic on both engines; a concurrent
        claimer waits for this transaction. ``wait=False`` on PostgreSQL: the row is locked for
        this transaction and a concurrent claimer skips it instead of queueing behind it (it
        finds it claimed once this commits) — for work that is simply looked at again later."""
        t, k = self.table, self.key
        if not wait and dialect_of(conn) == "postgres":
            conn.execute(f"INSERT INTO {t}({k}, owner, lease_until) VALUES (?, ?, 0) ON CONFLICT DO NOTHING",
                         (key, owner))
            row = conn.execute(f"SELECT {k} FROM {t} WHERE {k} = ? AND (owner = ? OR lease_until < ?)"
                               " FOR UPDATE SKIP LOCKED", (key, owner, now)).fetchone()
            if row is None:
                return False
            conn.execute(f"UPDATE {t} SET owner = ?, lease_until = ? WHERE {k} = ?", (owner, until, key))
            return True
        return conn.execute(
            f"INSERT INTO {t}({k}, owner, lease_until) VALUES (?,?,?)"
            f" ON CONFLICT({k}) DO UPDATE SET owner = excluded.owner, lease_until = excluded.lease_until"
            f" WHERE {t}.owner = excluded.owner OR {t}.lease_until < ?",
            (key, owner, until, now)).rowcount > 0

    def claim_many(self, conn: Any, keys: list[str], owner: str, now: float, until: float) -> set[str]:
        """:meth:`claim` for several keys in one statement (one round trip on PostgreSQL):
        the keys claimed. The rows are upserted in sorted key order, so two claimers of
        overlapping sets lock them in the same order, never in a cycle."""
        if not keys:
            return set()
        t, k = self.table, self.key
        keys = sorted(set(keys))
        rows = conn.execute(
            f"INSERT INTO {t}({k}, owner, lease_until) VALUES {', '.join(['(?,?,?)'] * len(keys))}"
            f" ON CONFLICT({k}) DO UPDATE SET owner = excluded.owner, lease_until = excluded.lease_until"
            f" WHERE {t}.owner = excluded.owner OR {t}.lease_until < ? RETURNING {k}",
            (*[v for key in keys for v in (key, owner, until)], now)).fetchall()
        return {r[0] for r in rows}

    def holder(self, conn: Any, key: str) -> tuple[str, float] | None:
        row = conn.execute(f"SELECT owner, lease_until FROM {self.table} WHERE {self.key} = ?", (key,)).fetchone()
        return None if row is None else (row[0], float(row[1]))

    def release(self, conn: Any, key: str, owner: str) -> int:
        return conn.execute(f"DELETE FROM {self.table} WHERE {self.key} = ? AND owner = ?", (key, owner)).rowcount

    def release_unless(self, conn: Any, key: str, owner: str, exists_sql: str, params: tuple) -> bool:
        """``release`` unless ``EXISTS (exists_sql)``, in one statement: True if it released."""
        return conn.execute(f"DELETE FROM {self.table} WHERE {self.key} = ? AND owner = ?"
                            f" AND NOT EXISTS ({exists_sql})", (key, owner, *params)).rowcount > 0

    def release_all(self, conn: Any, owner: str) -> int:
        return conn.execute(f"DELETE FROM {self.table} WHERE owner = ?", (owner,)).rowcount

    def renew(self, conn: Any, owner: str, until: float) -> int:
        return conn.execute(f"UPDATE {self.table} SET lease_until = ? WHERE owner = ?", (until, owner)).rowcount

    def held_by(self, conn: Any, owner: str) -> set[str]:
        return {r[0] for r in conn.execute(f"SELECT {self.key} FROM {self.table} WHERE owner = ?",
                                           (owner,)).fetchall()}


CONVERSATIONS = LeaseTable("conversation_leases", "conv_key")
JOBS = LeaseTable("consolidation_claims", "session_id")
# A replica's liveness: a conversation_leases row under a key no conversation has
# (conversation keys are chat ids: oc_…, api_…), owned by the one process using the id.
REPLICA_KEY = "replica:"


def database_now(conn: Any) -> float:
    """The database's own time, in epoch seconds."""
    if dialect_of(conn) == "postgres":
        return float(conn.execute("SELECT EXTRACT(EPOCH FROM clock_timestamp())").fetchone()[0])
    return float(conn.execute("SELECT (julianday('now') - 2440587.5) * 86400.0").fetchone()[0])


class DatabaseClock:
    """The database's clock as seen from this process: ``local()`` plus the offset measured at
    the last :meth:`sync` (half the round trip is the error: milliseconds against leases of
    seconds). Callable like ``time.time``, so the stores take it as their ``clock``."""

    SAMPLES = 8         # the offset of the fastest of the last few reads (NTP's rule)

    def __init__(self, local: Callable[[], float] = time.time) -> None:
        self.local = local
        self.offset = 0.0
        self._samples: list[tuple[float, float]] = []     # (round trip, offset)

    def __call__(self) -> float:
        return self.local() + self.offset

    async def sync(self, db: Any) -> float:
        """Read the database's time; the offset kept is the one measured with the shortest
        round trip among the last ``SAMPLES`` (a read delayed by load — seconds on a busy
        host — would otherwise put this replica's clock off by half that delay)."""
        t0 = self.local()
        now = await db.read(database_now)
        t1 = self.local()
        self._samples = [*self._samples[-(self.SAMPLES - 1):], (t1 - t0, now - (t0 + t1) / 2)]
        self.offset = min(self._samples)[1]
        return self.offset
