"""The two private parts of aiosqlite the SQLite backend (storage/sqlite.py) relies on — only here.

Why private at all: aiosqlite's public API hops to its connection thread once per statement
(execute, then fetch, then close the cursor). ``Database.read``/``write`` instead send one
plain function that runs a whole unit of work on the sqlite3 connection inside that thread:
one hop per unit of work, which is what keeps SQLite's measured speed (bench/README.md). For
that we need

- ``Connection._execute(fn, *args)``: run ``fn(*args)`` in the connection's own thread (the
  one thread that ever touches the sqlite3 connection), in submission order, and hand back its
  result or its exception;
- ``Connection._conn``: the sqlite3.Connection itself, to be used only inside that thread.

tests/test_aiosqlite_compat.py checks both, by shape and by behaviour, against the installed
aiosqlite; ``TESTED`` is the range it was run on and must equal pyproject.toml's pin, so an
upgrade of the pin is an upgrade of what was tested. (tests/round_trips.py and
bench/bench_throughput.py count hops by wrapping ``_execute``: instrumentation, same method.)
"""

from __future__ import annotations

import sqlite3
from typing import Any, Callable, TypeVar

import aiosqlite

T = TypeVar("T")

TESTED = ">=0.21,<0.23"   # pyproject.toml's pin; tests/test_aiosqlite_compat.py passed on 0.21.0 and 0.22.1


async def run_in_thread(aconn: aiosqlite.Connection, fn: Callable[..., T], *args: Any) -> T:
    """``fn(conn, *args)`` with ``conn`` the sqlite3 connection, in aiosqlite's connection
    thread: one hop there and back, queued behind (and ahead of) the connection's other calls."""
    # Looked up on the instance each time, so the hop counters above can wrap it.
    return await aconn._execute(_on_raw, aconn, fn, args)


def _on_raw(aconn: aiosqlite.Connection, fn: Callable[..., T], args: tuple) -> T:
    return fn(raw_connection(aconn), *args)


def raw_connection(aconn: aiosqlite.Connection) -> sqlite3.Connection:
    """The sqlite3 connection under ``aconn``; only ever use it in the connection's thread
    (inside a function given to ``run_in_thread``)."""
    return aconn._conn
