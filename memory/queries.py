"""A store's read as a value: its statement(s) and how to turn their rows into the answer, so
that several stores' reads for one message travel together (``fetch_together``: one round trip
on PostgreSQL, one hop on SQLite — ``Database.fetch_each``) while each store keeps its SQL.

The store's own method runs the same ``Query`` alone (``run``): one definition of each read."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Generic, Sequence, TypeVar

from storage import Database

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Query(Generic[T]):
    statements: tuple[tuple[str, tuple[Any, ...]], ...]
    decode: Callable[[list[list[Any]]], T]      # every statement's rows -> the answer
    writes: bool = False                         # a statement changes rows (a touch)


def answer(value: T) -> Query[T]:
    """A read with nothing to ask the database (e.g. no user: no facts)."""
    return Query((), lambda rows: value)


async def run(db: Database, query: Query[T]) -> T:
    if not query.statements:
        return query.decode([])
    if len(query.statements) == 1 and not query.writes:
        return query.decode([await db.fetchall(*query.statements[0])])
    return query.decode(await db.fetch_each(query.statements, write=query.writes))


async def fetch_together(db: Database, queries: Sequence[Query[Any]]) -> list[Any]:
    """Each query's answer, in order; all of their statements sent at once."""
    statements = [s for q in queries for s in q.statements]
    rows = await db.fetch_each(statements, write=any(q.writes for q in queries)) if statements else []
    out, at = [], 0
    for q in queries:
        n = len(q.statements)
        out.append(q.decode(rows[at:at + n]))
        at += n
    return out
