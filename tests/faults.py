"""Fault injection at the database, on either backend: a trigger that aborts inserts into a
table (SQLite: RAISE(ABORT); PostgreSQL: a plpgsql trigger raising an integrity violation),
and a second connection of the test's own to see what is committed."""

from __future__ import annotations

from typing import Any, Sequence


async def fail_inserts(db: Any, table: str, message: str = "disk on fire", when: str = "",
                       event: str = "INSERT") -> None:
    """Every INSERT (or ``event``) on ``table`` (where ``when``, an SQL condition on NEW) fails."""
    name = f"fail_{table}"
    if db.dialect == "postgres":
        cond = f"IF {when} THEN " if when else ""
        end = " END IF;" if when else ""
        await db.execute(
            f"CREATE FUNCTION {name}() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN {cond}"
            f"RAISE EXCEPTION '{message}' USING ERRCODE = 'integrity_constraint_violation';{end}"
            " RETURN NEW; END $$")
        await db.execute(f"CREATE TRIGGER {name} BEFORE {event} ON {table} FOR EACH ROW EXECUTE FUNCTION {name}()")
    else:
        cond = f" WHEN {when}" if when else ""
        await db.execute(f"CREATE TRIGGER {name} BEFORE {event} ON {table}{cond}"
                         f" BEGIN SELECT RAISE(ABORT, '{message}'); END")


async def restore_inserts(db: Any, table: str) -> None:
    name = f"fail_{table}"
    if db.dialect == "postgres":
        await db.execute(f"DROP TRIGGER {name} ON {table}")
        await db.execute(f"DROP FUNCTION {name}()")
    else:
        await db.execute(f"DROP TRIGGER {name}")


def read_elsewhere(db: Any, sql: str, params: Sequence[Any] = ()) -> list[tuple]:
    """``sql`` on a connection of its own (not the Database's): only committed rows."""
    if db.dialect == "postgres":
        import psycopg
        with psycopg.connect(db.url) as other:
            return [tuple(r) for r in other.execute(sql.replace("?", "%s"), list(params)).fetchall()]
    import sqlite3
    other = sqlite3.connect(db.path)
    try:
        return [tuple(r) for r in other.execute(sql, params).fetchall()]
    finally:
        other.close()
