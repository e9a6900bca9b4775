"""``ethan db copy --to postgresql://…``: an existing SQLite database into PostgreSQL, so a
team that outgrows one machine keeps its memory (DESIGN §7).

Row for row, column for column (the two schemas have the same tables, columns and version
numbers: storage/schema/postgres.py), in one transaction on the target. Idempotent: rows
already there (same primary key / unique key) are left alone, so a copy interrupted or run
twice ends in the same state. Verified: afterwards every table holds as many rows as the
source's, or the copy is refused (rolled back) with the tables that differ.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from storage import Database, DatabaseError, dialect_of
from memory.episodes.embedding import unpack

# Parents before children (foreign keys); the PostgreSQL schema's order.
ORDER = ("inbox", "outbox", "modes", "audit", "sessions", "conversations", "conversation_members",
         "messages", "warm_summaries", "consolidation_state", "consolidation_writes", "facts",
         "procedures", "profile_entries", "episodes", "episode_chunks", "episode_vectors", "fact_sources", "fact_messages",
         "profile_sources",
         "chat_greetings", "card_confirmations", "chats_left",
         "schedules", "schedule_deliveries",
         # leases (expired by the time a copy is used; copied so the counts verify as for any table)
         "conversation_leases", "consolidation_claims")
BATCH = 1000


class CopyRefused(DatabaseError):
    pass


@dataclass
class CopyResult:
    counts: dict[str, int] = field(default_factory=dict)     # rows per table in the target
    copied: dict[str, int] = field(default_factory=dict)     # rows new in the target this time


def _read_table(conn: Any, table: str, cols: list[str]) -> list[tuple]:
    return [tuple(r) for r in conn.execute(f'SELECT {", ".join(cols)} FROM "{table}" ORDER BY 1').fetchall()]


def _write_all(conn: Any, tables: list[tuple[str, list[str], list[tuple]]],
               session_stats: list[tuple]) -> dict[str, int]:
    """Run by Database.write on the target: every table's rows, one transaction."""
    copied: dict[str, int] = {}
    for table, cols, rows in tables:
        before = conn.execute(f'SELECT COUNT(*) FROM "{table}"').fetchone()[0]
        sql = (f'INSERT OR IGNORE INTO "{table}"({", ".join(cols)}) '
               f'VALUES ({", ".join("?" * len(cols))})')
        for i in range(0, len(rows), BATCH):
            conn.executemany(sql, rows[i:i + BATCH])
        copied[table] = conn.execute(f'SELECT COUNT(*) FROM "{table}"').fetchone()[0] - before
        if dialect_of(conn) == "postgres" and "id" in cols and table not in ("sessions",):
            # Identity columns continue after the copied ids.
            conn.execute(f"SELECT setval(pg_get_serial_sequence('{table}', 'id'),"
                         f" GREATEST((SELECT MAX(id) FROM \"{table}\"), 1))")
    # The message triggers counted the copied messages into their sessions once more:
    # the source's counters are the truth.
    conn.executemany("UPDATE sessions SET message_count = ?, user_turns = ?, updated_at = ? WHERE id = ?",
                     session_stats)
    # Verified inside the transaction, so a refused copy leaves nothing behind.
    have = _counts(conn, [t for t, _, _ in tables])
    differ = {t: (len(rows), have[t]) for t, _, rows in tables if len(rows) != have[t]}
    if differ:
        raise CopyRefused("row counts differ after the copy (source, target): " +
                          ", ".join(f"{t} {a}≠{b}" for t, (a, b) in differ.items()) +
                          " — the target holds rows of another database; copy into an empty one")
    return copied


def _as_floats(value: Any) -> Any:
    return unpack(value) if isinstance(value, (bytes, bytearray, memoryview)) else value


def _counts(conn: Any, tables: list[str]) -> dict[str, int]:
    return {t: int(conn.execute(f'SELECT COUNT(*) FROM "{t}"').fetchone()[0]) for t in tables}


async def copy_database(source: Database, target: Database) -> CopyResult:
    if await source.schema_version() != await target.schema_version():
        raise CopyRefused(f"schema versions differ (source {await source.schema_version()}, "
                          f"target {await target.schema_version()}): run the same Ethan on both")
    src_cols = await source.table_columns()
    dst_cols = await target.table_columns()
    tables = []
    for t in ORDER:
        if t not in src_cols:
            continue
        cols = [c for c, _ in src_cols[t] if c in {d for d, _ in dst_cols.get(t, [])}]
        rows = await source.read(_read_table, t, cols)
        if t == "episode_vectors" and "vec" in cols and target.dialect == "postgres":
            # SQLite's float32 BLOB (sqlite-vec's format) -> PostgreSQL's REAL[]
            at = cols.index("vec")
            rows = [(*r[:at], _as_floats(r[at]), *r[at + 1:]) for r in rows]
        tables.append((t, cols, rows))
    stats = await source.read(lambda c: [tuple(r) for r in c.execute(
        "SELECT message_count, user_turns, updated_at, id FROM sessions").fetchall()])
    copied = await target.write(_write_all, tables, stats)
    have = await target.read(_counts, [t for t, _, _ in tables])
    return CopyResult(counts=have, copied=copied)
